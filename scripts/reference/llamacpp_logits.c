// llamacpp_logits.c — dump llama.cpp's full-vocabulary logits for a token sequence, teacher-forced.
//
// Part of specula's reference fixtures (see scripts/reference/README.md). It links against the
// libllama built by scripts/build-llama-cpp.sh and evaluates the tokens in independent chunks of at
// most CHUNK tokens, each from an empty KV cache at positions 0..len-1 (the same chunking as
// numpy_forward.py), asking for logits at every position. No BOS is inserted: the ids are used as
// given. Output: N * n_vocab little-endian float32 logits, row i = logits after token i.
//
// Build and run (scripts/reference/regenerate.sh does both):
//     SRC=<llama.cpp source>; BIN=$(scripts/build-llama-cpp.sh | tail -n1)
//     cc -O2 -std=c11 -I"$SRC/include" -I"$SRC/ggml/include" scripts/reference/llamacpp_logits.c
//        -L"$BIN" -Wl,-rpath,"$BIN" -lllama -lggml -lggml-base -o /tmp/llamacpp_logits   (one line)
//     /tmp/llamacpp_logits MODEL.gguf TOKENS.i32 CHUNK THREADS OUT.f32 [exact]
//
// TOKENS.i32 is raw little-endian int32 ids. Context settings are llama.cpp's defaults
// (llama_context_default_params: f16 KV cache, flash attention "auto", n_ubatch 512) with
// n_ctx = n_batch = CHUNK, as llama-perplexity -c CHUNK -b CHUNK would use. A 6th argument "exact"
// makes the KV cache F32 and turns flash attention off (the CPU flash-attention path rounds to f16
// whatever the KV type); with make_f32_gguf.py's F32 copy that is plain float32 arithmetic, used for
// the exactness check of the NumPy reference.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet_log(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (level >= GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

static bool no_progress(float progress, void * user_data) {
    (void) progress;
    (void) user_data;
    return true;
}

int main(int argc, char ** argv) {
    if (argc != 6 && !(argc == 7 && strcmp(argv[6], "exact") == 0)) {
        fprintf(stderr, "usage: %s MODEL.gguf TOKENS.i32 CHUNK THREADS OUT.f32 [exact]\n", argv[0]);
        return 2;
    }
    const char * model_path = argv[1];
    const char * tokens_path = argv[2];
    const int chunk = atoi(argv[3]);
    const int threads = atoi(argv[4]);
    const char * out_path = argv[5];
    if (chunk <= 0 || threads <= 0) {
        fprintf(stderr, "CHUNK and THREADS must be positive\n");
        return 2;
    }

    FILE * ft = fopen(tokens_path, "rb");
    if (!ft) { perror(tokens_path); return 1; }
    fseek(ft, 0, SEEK_END);
    const long nbytes = ftell(ft);
    fseek(ft, 0, SEEK_SET);
    const int n_tokens = (int) (nbytes / (long) sizeof(llama_token));
    llama_token * tokens = malloc((size_t) n_tokens * sizeof(llama_token));
    if (fread(tokens, sizeof(llama_token), (size_t) n_tokens, ft) != (size_t) n_tokens) {
        fprintf(stderr, "short read on %s\n", tokens_path);
        return 1;
    }
    fclose(ft);

    llama_log_set(quiet_log, NULL);
    llama_backend_init();

    struct llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    mparams.progress_callback = no_progress;
    struct llama_model * model = llama_model_load_from_file(model_path, mparams);
    if (!model) { fprintf(stderr, "failed to load %s\n", model_path); return 1; }

    struct llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = (uint32_t) chunk;
    cparams.n_batch = (uint32_t) chunk;
    cparams.n_seq_max = 1;
    cparams.n_threads = threads;
    cparams.n_threads_batch = threads;
    cparams.no_perf = true;
    if (argc == 7) {
        cparams.type_k = GGML_TYPE_F32;
        cparams.type_v = GGML_TYPE_F32;
        cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    struct llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) { fprintf(stderr, "failed to create the context\n"); return 1; }

    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * fo = fopen(out_path, "wb");
    if (!fo) { perror(out_path); return 1; }

    struct llama_batch batch = llama_batch_init(chunk, 0, 1);
    for (int start = 0; start < n_tokens; start += chunk) {
        const int len = (n_tokens - start < chunk) ? n_tokens - start : chunk;
        llama_memory_clear(llama_get_memory(ctx), true);
        batch.n_tokens = len;
        for (int k = 0; k < len; ++k) {
            batch.token[k] = tokens[start + k];
            batch.pos[k] = k;
            batch.n_seq_id[k] = 1;
            batch.seq_id[k][0] = 0;
            batch.logits[k] = 1;
        }
        const int rc = llama_decode(ctx, batch);
        if (rc != 0) { fprintf(stderr, "llama_decode failed (%d) at chunk start %d\n", rc, start); return 1; }
        for (int k = 0; k < len; ++k) {
            const float * row = llama_get_logits_ith(ctx, k);
            if (fwrite(row, sizeof(float), (size_t) n_vocab, fo) != (size_t) n_vocab) {
                fprintf(stderr, "write failed\n");
                return 1;
            }
        }
        fprintf(stderr, "llamacpp_logits: chunk at %d (%d tokens) done\n", start, len);
    }
    fclose(fo);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(tokens);
    return 0;
}
