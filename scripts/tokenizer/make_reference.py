#!/usr/bin/env python3
"""make_reference.py — token ids from llama.cpp for the tokenizer agreement test.

Writes crates/model/tests/data/tokenizer/corpus.jsonl: one JSON object a line,
{"text": ..., "ids": [...], "parse_special": bool}, where `ids` is what llama.cpp's
`llama-tokenize` gives for `text` with the model's own BOS/EOS rule (no `--no-bos`; SmolLM2
and Qwen add neither, Gemma 3 adds BOS) and special-token parsing on or off. crates/model/tests/tokenizer_llamacpp.rs
checks that `Tokenizer::encode(text, true, parse_special)` gives exactly these ids.

Each string goes to llama-tokenize through a file of its own (`-f`, which the tool reads
byte for byte) with `--no-escape`, so no shell quoting, escape processing or trailing-newline
stripping can change it. A SOURCE file beside the corpus records the llama.cpp build and model.

Usage:
    scripts/tokenizer/make_reference.py            # model and llama.cpp from the usual scripts
    scripts/tokenizer/make_reference.py qwen2.5-coder-0.5b   # another model by name, pulled by
                                                   # `specula model pull`; corpus in tokenizer/NAME/
    scripts/tokenizer/make_reference.py gemma3-270m          # the SentencePiece vocabulary
    SPECULA_MODEL=/path/model.gguf LLAMA_CPP_BIN=/path/bin scripts/tokenizer/make_reference.py

The corpus itself is defined below (hand-written cases plus seeded random strings), so the
output only changes when llama.cpp or this list does.
"""

import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "crates/model/tests/data/tokenizer"

SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>",
    "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>",
    "<jupyter_start>", "<jupyter_text>", "<jupyter_code>", "<jupyter_output>",
    "<jupyter_script>", "<empty_output>",
]

HAND_WRITTEN = [
    # empty, whitespace alone
    "", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n\n", " \n ", "\t\t\t", " \t \n \r ",
    "\n \n  \n   ", "\r", "\u000b\u000c", "\u00a0", "\u3000", "\u2002\u2003 \u2009x", "\u0085",
    "a\u2028b\u2029c",
    # leading / trailing spaces
    "hello", " hello", "  hello", "   hello", "hello ", "hello  ", " hello world ",
    "Hello world", "Hello World", "HELLO WORLD", "hello\tworld", "hello\nworld", "hello\n\nworld",
    "hello \nworld", "hello  \n  world", "hello\r\nworld\r\n", "a  b   c    d     e",
    "word\t\tword\t \tword", "trailing tab\t", "trailing newline\n", "ends with spaces   ",
    # contractions
    "don't", "I'm here", "they've", "we'll", "it'd", "she's", "you're", "DON'T", "I'M",
    "it's 'quoted'", "rock 'n' roll", "'s 't 're 've 'm 'll 'd", "can’t won’t", "o'clock",
    "''", "'", "a ' b", "don 't",
    # digits and numbers
    "0", "7", "42", "123", "1234", "12345", "123456789", "3.14159265358979",
    "1,000,000", "1e-10", "-273.15", "0x1F4A9", "2024-05-17T12:34:56Z", "+1 (555) 010-9999",
    "99 bottles of beer", "abc123def456", "v1.2.3-rc4", "000123", "١٢٣٤٥", "½ ¾ ⅓", "Ⅻ Ⅳ",
    "x² + y³ = z⁴", "①②③", "१२३", "৫৬৭", "ten 10 TEN 十",
    "31415926535897932384626433832795028841971693993751058209749445923078164062862089986280348",
    # punctuation runs
    "!!!", "???", "...", "…", "--", "---", "----------", "====", "***bold***", "#!/bin/sh",
    "a.b.c", "e.g., i.e.", "Hello, world! How are you?", "(parens) [brackets] {braces}",
    "<angle> <<double>> </close>", "@user #tag $100 %50 ^up &and *star", "~tilde` `back`",
    "\"quoted\" 'single'", "«guillemets» „low“ “curly” ‘single’", "a—b–c", "semi;colon:colon",
    # code
    "def foo(x):\n    return x + 1\n",
    "fn main() {\n\tprintln!(\"Hello, {}!\", name);\n}\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "std::vector<std::pair<int, std::string>> v;",
    "{\"key\": \"value\", \"list\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "<html>\n  <body>\n    <p class=\"x\">Hi</p>\n  </body>\n</html>",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "if [ -f \"$FILE\" ]; then\n  echo \"found\" >&2\nfi",
    "x = [i**2 for i in range(10) if i % 2 == 0]",
    "    indented with four spaces\n        and eight",
    "\tindented with a tab\n\t\tand two",
    "const re = /^[a-z0-9_-]{3,16}$/i;",
    "// comment\n/* block\n   comment */",
    "```python\nprint('hi')\n```",
    "| col1 | col2 |\n|------|------|\n| a    | b    |",
    "- item 1\n- item 2\n  - nested\n\n1. first\n2. second",
    "# Heading\n\n## Subheading\n\nSome *emphasis* and **strong** text.",
    "import numpy as np\nimport torch.nn.functional as F",
    "user@example.com https://example.org/path?q=1&r=2#frag",
    "C:\\Users\\name\\file.txt",
    "lambda x: x if x else None",
    "a=1;b=2;c=a+b",
    "__init__ __name__ self._private",
    "camelCaseIdentifier snake_case_identifier SCREAMING_CASE kebab-case",
    # scripts and languages
    "naïve café résumé", "Straße", "İstanbul ıi", "ﬁ ﬂ ligatures", "Ångström", "Ελληνικά γράμματα",
    "Привет, мир!", "Здравствуйте", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก",
    "안녕하세요 세계", "こんにちは世界", "カタカナ ひらがな 漢字", "你好，世界！", "我爱自然语言处理。",
    "中文English混合text", "Tiếng Việt có dấu", "ქართული", "Հայերեն", "ᚠᚢᚦᚨᚱᚲ", "ꓚꓰꓡ",
    "e\u0301 combining acute", "n\u0303", "a\u030a\u0301", "Z\u0351\u0364\u0369a\u0350l\u036ag\u035bo",
    "\u200bzero\u200cwidth\u200djoin", "\ufeffBOM at start", "soft\u00adhyphen",
    "left\u202eright override", "tab\u0009and\u0009tabs",
    # emoji
    "😀", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷🇯🇵", "❤️", "I ❤️ Rust 🦀!", "emoji😀inside",
    " 😀 leading space", "🔥🔥🔥 fire", "1️⃣ keycap", "☃ ★ ♠ ♣", "𝕳𝖊𝖑𝖑𝖔 𝓦𝓸𝓻𝓵𝓭", "𝔸𝔹ℂ",
    # rare and odd code points
    "\u0378unassigned", "\ue000private\uf8ff", "\U0010fffd", "\ufffd replacement", "\u0000nul",
    "\u0001\u0002\u001f ctrl", "\u007fdel", "\u00ad", "\ufe0f", "\U0001f9d1\u200d\U0001f4bb",
    # bytes SmolLM2 has no token for (dropped, and no merge may join their neighbours)
    "\u0004\u0006\u0013\u0014\u0016\u001d", "ab\u0004cd", "\U00050000x\U000f0000",
    "\U000b8b42\U00079004", "ꆀ`伿+c\U0006372b뚜椕4\U000b8b42\U00079004M\U00089c08",
    # repetition
    "a" * 100, "ab" * 50, " " * 40, "\n" * 20, "ha" * 30 + "!", "😀" * 10, "的" * 20,
    "The quick brown fox jumps over the lazy dog. " * 5,
    # long prose
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
    "age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the "
    "season of Light, it was the season of Darkness.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut "
    "labore et dolore magna aliqua.\n\nUt enim ad minim veniam, quis nostrud exercitation.",
    # near-special texts
    "<|im_start", "im_start|>", "<|im_end|", "<|IM_START|>", "< |im_start|>", "<|endoftext|",
    "<repo_name", "<jupyter_code >",
]

# Strings with special tokens: tokenized both with and without special-token parsing.
SPECIAL_STRINGS = [
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>assistant\nThe answer is 4.<|im_end|>",
    "<|endoftext|>",
    "<|endoftext|><|endoftext|>",
    "<|im_end|><|im_start|>",
    "abc<|endoftext|>def",
    " <|im_start|> spaced <|im_end|> ",
    "<|im_start|><|im_start|>user",
    "text before\n<|im_start|>user\n多语言 😀 content<|im_end|>\n",
    "<<|im_start|>>",
    "<|im_start|>user\n<|im_start|>nested?<|im_end|><|im_end|>",
    "<reponame>specula<file_sep>src/main.rs<filename>main.rs\nfn main() {}",
    "<jupyter_start><jupyter_code>print(1)<jupyter_output>1<empty_output>",
    "<issue_start>title<issue_comment>body<issue_closed>",
    "<gh_stars>100<repo_name>x",
    "".join(SPECIALS),
    " ".join(SPECIALS),
    "\n".join(SPECIALS),
]

POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " \t\n\r",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "éèêëàâäôöûüçñßøåæœÀÉÎÕÜ",
    "αβγδεζηθλμπσφψωΔΣΩ",
    "абвгдежзийклмнопрстуфхцчшщыэюя",
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
    "あいうえおかきくけこアイウエオ",
    "가나다라마바사아자차카타파하",
    "😀😂🤔👍🎉🚀🌍🔥💡✨🦀🐍",
    "\u0301\u0303\u200d\ufe0f\u00a0\u3000",
]


# Each named model's own special tokens, in strings parsed with and without special parsing.
MODEL_SPECIAL_STRINGS = {
    "qwen2.5-coder-0.5b": [
        "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "<|fim_prefix|>def f(x):<|fim_suffix|>    return y<|fim_middle|>",
        "<|repo_name|>specula<|file_sep|>main.rs<|fim_pad|><|endoftext|>",
        "<tool_response>\n{\"temp\": 21}\n</tool_response>",
    ],
    # SentencePiece (`llama` vocabulary): CONTROL turn markers; USER_DEFINED runs of newlines,
    # spaces and tabs, HTML tags and image markers (always cut out, whatever parse_special says);
    # `</s>`, which llama.cpp retypes as control because it looks like an end token; text that
    # only looks special, literal `▁` (escaped spaces) and `<0xXX>` texts (byte tokens).
    "gemma3-270m": [
        "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
        "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"
        "The answer is 4.<end_of_turn>\n",
        "<start_of_turn>user\nYou are a helpful assistant.\n\nWrite a haiku about Rust."
        "<end_of_turn>\n<start_of_turn>model\n",
        "<bos>", "<eos>", "<bos>hello<eos>", "<pad><unk><mask>", "<bos><bos>x",
        "<start_of_turn>", "<end_of_turn>", "<start_of_turn>model", " <end_of_turn> ",
        "<start_of_turn", "end_of_turn>", "<end_of_turn >", "<START_OF_TURN>",
        "a  b", "a   b", "a\n\nb", "a\n\n\nb", "x\t\ty", "x\t\t\ty", " \t\n  \t\t\n\n   ",
        " " * 31 + "x", " " * 32 + "x", " " * 35, "\n" * 31, "\n" * 40, "\t" * 33, "\t \t  \t",
        "line one\n\n\nline two\n    indented\n\t\ttabbed",
        "<start_of_image><end_of_image>", "look: <start_of_image> here", "[multimodal]",
        "<table><tr><td>1</td><td>2</td></tr></table>", "<b>bold</b> <i>it</i> <u>u</u>",
        "<s>strike</s> and </s> alone", "</s>", "<html><body><div>x</div></body></html>",
        "<h1>Title</h1>\n<blockquote>quote</blockquote>", "<code>fn main() {}</code>",
        "<a>link</a><img></img><span>s</span><bbox>1 2</bbox>", "<ul><li>a</li></ul>",
        "<unused0><unused6241>", "<unused99>x", "<TABLE> <Tr> <b >",
        "<0x41><0x0A><0xFF>", "<0x", "\u2581", "\u2581\u2581hello\u2581world", "a\u2581 \u2581b",
        "\u2581\u2581\u2581\u2581\u2581\u2581\u2581\u2581", " leading", "  two leading",
        "trailing ", "mixed \u2581 spaces", "\U0001fae8 new emoji", "\U000e0100\U000e01ef",
        "\ud7ff\ue000\uffff", "\U0010ffff\U000f0000", "\x7f\x80\x9f",
    ],
}


def random_strings(n, seed=20240517):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(1, 60)
        pools = rng.sample(POOLS, rng.randint(1, 4))
        out.append("".join(rng.choice(rng.choice(pools)) for _ in range(length)))
    return out


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def last_line(cmd):
    lines = [l for l in run(cmd).splitlines() if l.strip()]
    if not lines:
        sys.exit(f"make_reference: no output from {cmd[0]}")
    return lines[-1]


def tokenize(bin_dir, model, text, parse_special, tmp):
    path = Path(tmp) / "prompt.txt"
    path.write_bytes(text.encode("utf-8"))
    cmd = [str(Path(bin_dir) / "llama-tokenize"), "-m", model, "-f", str(path), "--ids",
           "--no-escape", "--log-disable"]
    if not parse_special:
        cmd.append("--no-parse-special")
    out = subprocess.run(cmd, check=True, capture_output=True)
    lines = [l for l in out.stdout.decode("utf-8").splitlines() if l.startswith("[")]
    if len(lines) != 1:
        sys.exit(f"make_reference: unexpected llama-tokenize output for {text!r}: {out.stdout!r}")
    return json.loads(lines[0])


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else None
    out_dir = OUT_DIR / name if name else OUT_DIR
    if name:
        model = last_line(["cargo", "run", "--release", "--quiet", "-p", "specula", "--",
                            "model", "pull", name])
    else:
        model = os.environ.get("SPECULA_MODEL") or last_line([str(ROOT / "scripts/fetch-model.sh")])
    bin_dir = os.environ.get("LLAMA_CPP_BIN") or last_line([str(ROOT / "scripts/build-llama-cpp.sh")])

    cases = [(t, True) for t in HAND_WRITTEN + random_strings(60)]
    specials = SPECIAL_STRINGS + MODEL_SPECIAL_STRINGS.get(name, [])
    cases += [(t, ps) for t in specials for ps in (True, False)]
    seen = set()
    unique = []
    for c in cases:
        if c not in seen:
            seen.add(c)
            unique.append(c)

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, open(out_dir / "corpus.jsonl", "w", encoding="utf-8") as f:
        for i, (text, parse_special) in enumerate(unique):
            ids = tokenize(bin_dir, model, text, parse_special, tmp)
            f.write(json.dumps({"text": text, "ids": ids, "parse_special": parse_special},
                               ensure_ascii=False) + "\n")
            if (i + 1) % 50 == 0:
                print(f"make_reference: {i + 1}/{len(unique)}", file=sys.stderr)

    sha = hashlib.sha256(Path(model).read_bytes()).hexdigest()
    version_file = Path(bin_dir).parent.parent / "VERSION"
    version = version_file.read_text().strip() if version_file.exists() else "unknown"
    (out_dir / "SOURCE").write_text(
        "corpus.jsonl: ids from llama.cpp's llama-tokenize (scripts/tokenizer/make_reference.py)\n"
        f"llama.cpp: {' | '.join(version.splitlines())}\n"
        f"model: {Path(model).name} sha256 {sha}\n")
    print(f"make_reference: wrote {len(unique)} cases to {out_dir / 'corpus.jsonl'}", file=sys.stderr)


if __name__ == "__main__":
    main()
