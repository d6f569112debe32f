#!/usr/bin/env python3
"""compare_llamacpp.py — llama.cpp's figures beside the float64 reference, and the fixture's meta.json.

Part of specula's reference fixtures (see scripts/reference/README.md; regenerate.sh runs it after
numpy_forward.py, llamacpp_logits and llama-perplexity). It reads:
    --work-dir/numpy_logprobs.npy      full float64 log-probs of the reference   [n_pos, n_vocab]
    --work-dir/llamacpp_logits.f32     llama.cpp's float32 logits, Q4_1 model    [n_pos, n_vocab]
    --work-dir/llamacpp_f32_logits.f32 (optional) llama.cpp on the F32 copy, F32 KV cache, no flash attention
    --work-dir/kld_base.bin            (optional) llama-perplexity --kl-divergence-base output
    --work-dir/llama_perplexity.log    (optional) llama-perplexity's log (its final PPL is parsed)
    --work-dir/info.json, timings.json written by numpy_forward.py / regenerate.sh
and writes into --out-dir (little-endian, row-major, row i = position i):
    llamacpp_top20_ids.bin               uint32  [n_pos, 20]  llama.cpp's 20 most probable next tokens
    llamacpp_top20_logprobs.bin          float32 [n_pos, 20]  their log-probabilities
    llamacpp_target_logprobs.bin         float64 [n_pos-1]    log-prob of ids[i+1]
    llamacpp_logprobs_at_numpy_top20.bin float32 [n_pos, 20]  llama.cpp's log-probs of the reference's top-20 ids
    meta.json                            shapes, scheme, versions, commands and the figures

Figures (all over the same tokens and chunking):
    top-1 agreement   argmax of llama.cpp == argmax of the reference, over all n_pos positions
    KL full           mean over positions of KL(ref || llama.cpp) = sum_v p(v) (log p(v) - log q(v)), nats
    KL top-20         the same with the vocabulary lumped into the reference's top-20 ids + one "rest"
                      bucket, computed from the fixture files exactly as a Rust test can:
                      sum_{j in top20} p_j (lp_j - lq_j) + p_rest (log p_rest - log q_rest),
                      p_rest = 1 - sum_j p_j, q_rest = 1 - sum_j q_j (q from *_logprobs_at_numpy_top20)
    perplexity        exp(-mean(target log-probs)) over the n_pos-1 predictions ids[i] -> ids[i+1]

Run: see regenerate.sh. pip packages: numpy==2.4.6 (gguf not needed here).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys

import numpy as np

K = 20


def log(msg: str) -> None:
    print(f"compare_llamacpp: {msg}", file=sys.stderr, flush=True)


def log_softmax_rows(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    z = x - x.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def top_k(lp: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest entries per row, best first, ties broken by the smaller id."""
    part = np.argpartition(-lp, k, axis=1)[:, : k + 1]
    out = np.empty((lp.shape[0], k), dtype=np.int64)
    for r in range(lp.shape[0]):
        kth = np.sort(lp[r, part[r]])[::-1][k - 1]
        cand = np.nonzero(lp[r] >= kth)[0]
        order = np.lexsort((cand, -lp[r, cand]))
        out[r] = cand[order[:k]]
    return out


def kl_top20(ref_lp20: np.ndarray, cand_lp_at_ref20: np.ndarray) -> np.ndarray:
    """Per-position KL(ref || cand) with the vocabulary lumped into the ref's top-20 + rest."""
    lp = ref_lp20.astype(np.float64)
    lq = cand_lp_at_ref20.astype(np.float64)
    p = np.exp(lp)
    q = np.exp(lq)
    p_rest = np.clip(1.0 - p.sum(axis=1), 0.0, 1.0)
    q_rest = np.clip(1.0 - q.sum(axis=1), 1e-30, 1.0)
    rest = np.where(p_rest > 0, p_rest * (np.log(np.maximum(p_rest, 1e-30)) - np.log(q_rest)), 0.0)
    return (p * (lp - lq)).sum(axis=1) + rest


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def figures(ref_full, cand_logits_path, ids, chunk, rows_per_block=256):
    """Stream over positions; returns dict of figures plus the candidate's compact arrays."""
    n, V = ref_full.shape
    cand = np.memmap(cand_logits_path, dtype="<f4", mode="r")
    if cand.size != n * V:
        raise SystemExit(f"compare_llamacpp: {cand_logits_path} has {cand.size} values, expected {n}x{V}")
    cand = cand.reshape(n, V)
    kl = np.empty(n)
    ref_top1 = np.empty(n, dtype=np.int64)
    cand_top = np.empty((n, K), dtype=np.int64)
    cand_top_lp = np.empty((n, K))
    cand_target = np.empty(max(n - 1, 0))
    ref_target = np.empty(max(n - 1, 0))
    ref_margin = np.empty(n)
    max_abs_dlp_top = 0.0
    for s in range(0, n, rows_per_block):
        e = min(n, s + rows_per_block)
        lp = np.asarray(ref_full[s:e])
        lq = log_softmax_rows(np.asarray(cand[s:e]))
        kl[s:e] = (np.exp(lp) * (lp - lq)).sum(axis=1)
        ref_top1[s:e] = lp.argmax(axis=1)
        two = np.sort(lp, axis=1)[:, -2:]
        ref_margin[s:e] = two[:, 1] - two[:, 0]
        ti = top_k(lq, K)
        cand_top[s:e] = ti
        cand_top_lp[s:e] = np.take_along_axis(lq, ti, axis=1)
        rt = top_k(lp, K)
        max_abs_dlp_top = max(max_abs_dlp_top, float(np.abs(np.take_along_axis(lp - lq, rt, axis=1)).max()))
        for i in range(s, min(e, n - 1)):
            cand_target[i] = lq[i - s, ids[i + 1]]
            ref_target[i] = lp[i - s, ids[i + 1]]
    agree = cand_top[:, 0] == ref_top1
    dis_margins = ref_margin[~agree]
    return {
        "kl": kl, "agree": agree, "cand_top": cand_top, "cand_top_lp": cand_top_lp,
        "cand_target": cand_target, "ref_target": ref_target, "cand": cand,
        "summary": {
            "top1_agreement_percent": round(100.0 * agree.mean(), 3),
            "top1_agree_positions": int(agree.sum()),
            "top1_disagree_positions": int((~agree).sum()),
            "disagreements_with_reference_top2_margin_below_0.1_nats": int((dis_margins < 0.1).sum()),
            "largest_reference_top2_margin_at_a_disagreement_nats":
                round(float(dis_margins.max()), 5) if dis_margins.size else None,
            "kl_full_vocab_mean_nats": float(kl.mean()),
            "kl_full_vocab_median_nats": float(np.median(kl)),
            "kl_full_vocab_p99_nats": float(np.quantile(kl, 0.99)),
            "kl_full_vocab_max_nats": float(kl.max()),
            "max_abs_logprob_diff_on_reference_top20": max_abs_dlp_top,
            "perplexity": float(np.exp(-cand_target.mean())),
        },
    }


def decode_kld_base(path: str):
    """llama-perplexity --kl-divergence-base file: header, tokens, then per chunk (n_ctx-1-n_ctx/2) rows
    of nv uint16 (first 4 uint16 = float32 scale and min_log_prob), log p = min_log_prob + scale*q."""
    with open(path, "rb") as f:
        if f.read(8) != b"_logits_":
            raise SystemExit(f"compare_llamacpp: {path} is not a llama-perplexity logits file")
        n_ctx, n_vocab, n_chunk = np.frombuffer(f.read(12), dtype="<i4")
        tokens = np.frombuffer(f.read(4 * n_ctx * n_chunk), dtype="<i4")
        nv = 2 * ((n_vocab + 1) // 2) + 4
        rows = n_ctx - 1 - n_ctx // 2
        data = np.frombuffer(f.read(), dtype="<u2").reshape(n_chunk, rows, nv)
    return int(n_ctx), int(n_vocab), int(n_chunk), tokens, data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--model", required=True, help="the GGUF file (for its SHA-256 and name)")
    ap.add_argument("--text", required=True, help="the reference text file (repository-relative path)")
    ap.add_argument("--llama-version", default="", help="contents of llama.cpp's VERSION file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--format", default="Q4_1", help="the model file's format name (Q4_1: the shipped file)")
    ap.add_argument("--requantized-from", help="the file --model was requantised from (scripts/requantize.sh)")
    ap.add_argument("--kept-files", help="comma-separated: the files of --out-dir that are committed "
                                         "(meta.json lists only these; default: all)")
    args = ap.parse_args()

    with open(args.tokens) as f:
        ids = np.asarray(json.load(f)["ids"], dtype=np.int64)
    n = len(ids)
    W = args.work_dir
    ref_full = np.load(os.path.join(W, "numpy_logprobs.npy"), mmap_mode="r")
    if ref_full.shape[0] != n:
        raise SystemExit("compare_llamacpp: reference and tokens disagree in length")
    V = ref_full.shape[1]
    info = json.load(open(os.path.join(W, "info.json")))
    timings = json.load(open(os.path.join(W, "timings.json"))) if os.path.exists(os.path.join(W, "timings.json")) else {}
    out = args.out_dir

    ref_ids20 = np.fromfile(os.path.join(out, "numpy_top20_ids.bin"), dtype="<u4").reshape(n, K).astype(np.int64)
    ref_lp20 = np.fromfile(os.path.join(out, "numpy_top20_logprobs.bin"), dtype="<f4").reshape(n, K)
    ref_target_fixture = np.fromfile(os.path.join(out, "numpy_target_logprobs.bin"), dtype="<f8")

    # --- llama.cpp, on the model file (the figures) ---------------------------------------------
    log(f"llama.cpp ({args.format}) vs reference")
    fq = figures(ref_full, os.path.join(W, "llamacpp_logits.f32"), ids, args.chunk)
    cand = fq["cand"]
    at_ref = np.empty((n, K))
    for s in range(0, n, 256):
        e = min(n, s + 256)
        lq = log_softmax_rows(np.asarray(cand[s:e]))
        at_ref[s:e] = np.take_along_axis(lq, ref_ids20[s:e], axis=1)
    fq["cand_top"].astype("<u4").tofile(os.path.join(out, "llamacpp_top20_ids.bin"))
    fq["cand_top_lp"].astype("<f4").tofile(os.path.join(out, "llamacpp_top20_logprobs.bin"))
    fq["cand_target"].astype("<f8").tofile(os.path.join(out, "llamacpp_target_logprobs.bin"))
    at_ref32 = at_ref.astype("<f4")
    at_ref32.tofile(os.path.join(out, "llamacpp_logprobs_at_numpy_top20.bin"))
    kl20 = kl_top20(ref_lp20, at_ref32)
    summary = dict(fq["summary"])
    summary["kl_top20_lumped_mean_nats"] = float(kl20.mean())
    summary["kl_top20_lumped_max_nats"] = float(kl20.max())
    summary["top1_agreement_from_fixture_percent"] = round(
        100.0 * float((np.fromfile(os.path.join(out, "llamacpp_top20_ids.bin"), dtype="<u4").reshape(n, K)[:, 0]
                       == ref_ids20[:, 0]).mean()), 3)
    per_chunk = []
    for s in range(0, n, args.chunk):
        e = min(n, s + args.chunk)
        per_chunk.append({"range": [s, e],
                          "top1_agreement_percent": round(100.0 * fq["agree"][s:e].mean(), 3),
                          "kl_full_vocab_mean_nats": float(fq["kl"][s:e].mean())})
    summary["per_chunk"] = per_chunk
    ref_ppl = float(np.exp(-fq["ref_target"].mean()))
    assert np.allclose(fq["ref_target"], ref_target_fixture), "reference targets differ from numpy_forward's"

    # --- llama.cpp on the F32 copy (exactness check of the reference) ---------------------------
    f32_summary = None
    p = os.path.join(W, "llamacpp_f32_logits.f32")
    if os.path.exists(p):
        log("llama.cpp (F32 copy, F32 KV, no flash attention) vs reference")
        f32_summary = figures(ref_full, p, ids, args.chunk)["summary"]

    # --- llama-perplexity ---------------------------------------------------------------------
    lp_section = None
    plog = os.path.join(W, "llama_perplexity.log")
    if os.path.exists(plog):
        text = open(plog, errors="replace").read()
        m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", text)
        ppl_val, ppl_err = (float(m.group(1)), float(m.group(2))) if m else (None, None)
        c = args.chunk
        n_chunks = n // c          # llama-perplexity uses floor(n_tokens / n_ctx) whole chunks
        first = c // 2             # and scores positions first .. c-2 of each (predicting first+1 .. c-1)
        pos = np.concatenate([np.arange(k * c + first, k * c + c - 1) for k in range(n_chunks)])
        lp_section = {
            "command": f"llama-perplexity -m $MODEL -f {args.text} -c {c} -b {c} -t {args.threads} "
                       f"--kl-divergence-base $WORK/kld_base.bin",
            "final_estimate_ppl": ppl_val,
            "final_estimate_ppl_plus_minus": ppl_err,
            "what_it_measures": (
                f"llama-perplexity tokenizes the text itself (common -f: one trailing newline stripped; "
                f"no BOS since add_bos_token is false), cuts it into floor(n_tokens/{c}) = {n_chunks} chunks of "
                f"{c} tokens (the rest is dropped), evaluates each from an empty KV cache and scores only the "
                f"second half of each chunk: logits at positions {first}..{c - 2} predicting tokens "
                f"{first + 1}..{c - 1}, i.e. {c - 1 - first} predictions per chunk, {len(pos)} in all. "
                f"Its chunks coincide with ours, so the same subset of our predictions reproduces its figure."),
            "n_predictions": int(len(pos)),
            "our_llamacpp_ppl_on_the_same_predictions": float(np.exp(-fq["cand_target"][pos].mean())),
            "reference_ppl_on_the_same_predictions": float(np.exp(-fq["ref_target"][pos].mean())),
        }
        kb = os.path.join(W, "kld_base.bin")
        if os.path.exists(kb):
            n_ctx, n_vocab, n_chunk, ktok, data = decode_kld_base(kb)
            same_tokens = bool(np.array_equal(ktok, ids[: n_ctx * n_chunk]))
            # dequantise its stored log-probs (16-nat window below the max) and compare with ours
            rows = n_ctx - 1 - n_ctx // 2
            worst = 0.0
            for k in range(n_chunk):
                d = data[k]
                hdr = d[:, :4].copy().view("<f4")
                scale, minlp = hdr[:, 0:1].astype(np.float64), hdr[:, 1:2].astype(np.float64)
                q = d[:, 4:4 + n_vocab].astype(np.float64)
                base = minlp + scale * q
                start = k * n_ctx + n_ctx // 2
                ours = log_softmax_rows(np.asarray(cand[start:start + rows]))
                keep = q > 0                       # entries inside its 16-nat window
                worst = max(worst, float(np.abs(base - ours)[keep].max()))
            lp_section["kl_divergence_base_file"] = {
                "tokens_identical_to_ours": same_tokens,
                "n_ctx": n_ctx, "n_chunk": n_chunk, "rows_per_chunk": rows,
                "max_abs_diff_vs_our_llamacpp_logprobs_in_its_16_nat_window": worst,
                "note": "its uint16 log-prob encoding has a step of at most 16/65535 = 2.4e-4 nats",
            }

    files = {
        "tokens.json": {"format": "JSON object, key 'ids': list of n_pos token ids"},
        "tokens.bin": {"dtype": "u32 LE", "shape": [n]},
        "numpy_top20_ids.bin": {"dtype": "u32 LE", "shape": [n, K], "order": "best first, ties by smaller id"},
        "numpy_top20_logprobs.bin": {"dtype": "f32 LE", "shape": [n, K]},
        "numpy_target_logprobs.bin": {"dtype": "f64 LE", "shape": [n - 1]},
        "llamacpp_top20_ids.bin": {"dtype": "u32 LE", "shape": [n, K]},
        "llamacpp_top20_logprobs.bin": {"dtype": "f32 LE", "shape": [n, K]},
        "llamacpp_target_logprobs.bin": {"dtype": "f64 LE", "shape": [n - 1]},
        "llamacpp_logprobs_at_numpy_top20.bin": {"dtype": "f32 LE", "shape": [n, K],
                                                 "meaning": "llama.cpp's log-probs of numpy_top20_ids"},
    }
    if args.kept_files:
        keep = [f for f in args.kept_files.split(",") if f]
        files = {f: files[f] for f in keep if f in files}
    requant = None
    if args.requantized_from:
        requant = {
            "command": f"llama-quantize --allow-requantize {os.path.basename(args.requantized_from)} "
                       f"{os.path.basename(args.model)} {args.format}  (scripts/requantize.sh {args.format})",
            "source_file": os.path.basename(args.requantized_from),
            "source_sha256": sha256_file(args.requantized_from),
            "note": "a requantisation of the shipped Q4_1 file, not a quantisation of the original weights; "
                    "the reference and llama.cpp's figures here are computed on this file's own weights, "
                    "so they measure each implementation's arithmetic on it",
        }
    meta = {
        "description": f"Reference next-token distributions for {info['metadata'].get('general.name') or 'the model'} "
                       f"({args.format}) over "
                       "scripts/reference/reference_text.txt, from an exact float64 NumPy forward pass "
                       "(numpy_*) and from llama.cpp ("
                       + ("llamacpp_*" if not requant else "its figures below; its files are not kept")
                       + "). See scripts/reference/README.md.",
        **({"format": args.format} if requant else {}),
        "text_file": args.text,
        "text_sha256": sha256_file(args.text),
        "tokenization": {
            "tool": "llama-tokenize -m $MODEL -f " + args.text + " --ids --log-disable",
            "text_bytes": "the file verbatim, including its final newline (llama-tokenize -f reads it unchanged)",
            "bos_prepended": False,
            "why": "tokenizer.ggml.add_bos_token is false in the GGUF, so llama.cpp adds no BOS",
            "n_tokens": int(n),
            **({"identical_to": "the Q4_1 fixture's tokens.bin (same tokenizer; regenerate.sh asserts it)"}
               if requant else {}),
        },
        "model": {
            "file": os.path.basename(args.model),
            "sha256": sha256_file(args.model),
            "metadata": info["metadata"],
            "tensor_types": info["tensor_types"],
            "tied_embeddings": info["tied_embeddings"],
            "n_vocab": int(V),
            **({"requantised": requant} if requant else {}),
        },
        "chunking": {
            "scheme": f"independent chunks of at most {args.chunk} tokens: tokens [c*{args.chunk}, "
                      f"(c+1)*{args.chunk}) are evaluated from an empty context at positions 0..len-1, "
                      f"causal attention within the chunk only; no BOS is inserted at chunk starts",
            "chunk_size": args.chunk,
            "chunks": [[s, min(n, s + args.chunk)] for s in range(0, n, args.chunk)],
            "targets": "row i (0 <= i < n_pos-1) of *_target_logprobs is log p(ids[i+1] | the chunk's "
                       "tokens up to i); at the last position of a chunk the target is the first token "
                       "of the next chunk (still a valid prediction from that position)",
        },
        "n_pos": int(n),
        "k": K,
        "files": files,
        "reference": {
            "implementation": "scripts/reference/numpy_forward.py: float64 throughout, weights dequantised "
                              "by gguf.quants.dequantize (checked bit-exact against a float64 dequantisation)",
            "rope": "llama.cpp NORMAL mode (0): adjacent pairs (2i, 2i+1), theta_i = pos * base^(-2i/64)",
            "gguf_version": info["gguf_version"],
            "numpy_version": info["numpy_version"],
            "perplexity": ref_ppl,
        },
        "llamacpp": {
            "version": args.llama_version.strip(),
            "harness": "scripts/reference/llamacpp_logits.c: llama_decode on each chunk with logits at every "
                       f"position; llama_context_default_params (f16 KV cache, flash attention auto, n_ubatch 512) "
                       f"with n_ctx = n_batch = {args.chunk}, {args.threads} threads",
            "vs_reference": summary,
        },
        "llamacpp_f32_exactness_check": None if f32_summary is None else {
            "what": "llama.cpp on a copy of the model with every tensor dequantised to F32 "
                    "(make_f32_gguf.py), an F32 KV cache and flash attention off (llamacpp_logits.c 'exact'): "
                    "plain float32 arithmetic with no activation quantisation, so this isolates whether the "
                    "reference computes what llama.cpp computes",
            "vs_reference": f32_summary,
        },
        "llama_perplexity": lp_section,
        "timings_seconds": timings,
    }
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    log(f"top-1 agreement {summary['top1_agreement_percent']}%, KL full {summary['kl_full_vocab_mean_nats']:.6f}, "
        f"KL top-20 {summary['kl_top20_lumped_mean_nats']:.6f}, PPL ref {ref_ppl:.4f} llama.cpp {summary['perplexity']:.4f}")
    if f32_summary:
        log(f"F32 check: top-1 {f32_summary['top1_agreement_percent']}%, KL {f32_summary['kl_full_vocab_mean_nats']:.3e}")
    if lp_section:
        log(f"llama-perplexity PPL {lp_section['final_estimate_ppl']} vs ours on the same predictions "
            f"{lp_section['our_llamacpp_ppl_on_the_same_predictions']:.4f}")


if __name__ == "__main__":
    main()
