"""Write a tiny random-weight llama-architecture GGUF that llama-cpp-python's server loads and serves.

Run with the llama.cpp venv's interpreter (it needs the ``gguf`` package and numpy)::

    python tests/e2e/tiny_gguf.py OUTDIR        -> OUTDIR/tiny-llama.gguf

Nothing can be downloaded here, so the weights are random and the vocabulary is built in this file: a
SentencePiece-style ("llama") vocabulary of a few hundred pieces (the 256 byte-fallback tokens, the
printable ASCII characters, "▁" plus each letter, and a few whole words), so that any text tokenizes and any
generated token detokenizes. The point is a real llama.cpp load (metadata, tensors, context) and real
completions in well under a second on 2 cores, not sensible output.

Idempotent: a complete OUTDIR (marker file written last, after an atomic rename) is left untouched.
"""

from __future__ import annotations

import json
import os
import string
import sys
import tempfile
from pathlib import Path

# Bump "recipe" when anything below changes so cached models are rebuilt instead of silently reused.
RECIPE = {
    "recipe": 1,
    "n_embd": 64,
    "n_head": 4,
    "n_head_kv": 2,
    "n_layer": 2,
    "n_ff": 128,
    "n_ctx_train": 512,
    "seed": 1234,
}
MODEL_FILE = "tiny-llama.gguf"
MARKER = ".hangwatch-tiny-gguf.json"
SPACE = "\u2581"  # SentencePiece's word-boundary mark
WORDS = ("Hello", "hello", "the", "server", "is", "ready", "world", "token", "model", "user")

# The same minimal template as the safetensors tiny model: llama-cpp-python renders chat requests with it.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def is_complete(outdir: Path) -> bool:
    marker = outdir / MARKER
    if not marker.is_file() or not (outdir / MODEL_FILE).is_file():
        return False
    try:
        return bool(json.loads(marker.read_text()) == RECIPE)
    except (OSError, ValueError):
        return False


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Pieces, scores and token types of an SPM vocabulary (llama.cpp merges the highest score first)."""
    from gguf import TokenType

    pieces = ["<unk>", "<s>", "</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    # Byte fallback: a character without a piece of its own becomes its UTF-8 bytes, so no text fails.
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256
    normal: list[str] = [SPACE]
    normal += [c for c in string.printable if c not in string.whitespace or c == "\n"]
    normal += [SPACE + c for c in string.ascii_letters]
    for word in WORDS:  # every prefix, so that the pairwise merges can reach the whole word
        normal += [SPACE + word[:n] for n in range(2, len(word) + 1)]
    seen: set[str] = set()
    for piece in normal:
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)
            types.append(TokenType.NORMAL)
    # Longer pieces win a merge; control and byte tokens never take part in one.
    scores = [0.0 if t != TokenType.NORMAL else float(len(p)) for p, t in zip(pieces, types, strict=True)]
    return pieces, scores, [int(t) for t in types]


def write_model(path: Path) -> None:
    import gguf
    import numpy as np

    r = RECIPE
    n_embd, n_head, n_head_kv, n_ff = r["n_embd"], r["n_head"], r["n_head_kv"], r["n_ff"]
    head_dim = n_embd // n_head
    n_embd_kv = head_dim * n_head_kv
    pieces, scores, types = vocabulary()
    n_vocab = len(pieces)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("hangwatch-tiny-llama")
    writer.add_context_length(r["n_ctx_train"])
    writer.add_embedding_length(n_embd)
    writer.add_block_count(r["n_layer"])
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(r["seed"])

    def weight(*shape: int) -> np.ndarray:
        # numpy's shape is ggml's ne reversed: (rows = outputs, columns = inputs).
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    ones = np.ones(n_embd, dtype=np.float32)
    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd))
    for i in range(r["n_layer"]):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(n_embd_kv, n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(n_embd_kv, n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", weight(n_vocab, n_embd))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUTDIR", file=sys.stderr)
        return 2
    outdir = Path(argv[1])
    if is_complete(outdir):
        print(outdir / MODEL_FILE)
        return 0
    outdir.mkdir(parents=True, exist_ok=True)
    # Written beside its final name and renamed: a concurrent or interrupted build never leaves a torn file.
    fd, tmp = tempfile.mkstemp(prefix=".tiny-", suffix=".gguf", dir=outdir)
    os.close(fd)
    try:
        write_model(Path(tmp))
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the model is no secret
        os.replace(tmp, outdir / MODEL_FILE)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    (outdir / MARKER).write_text(json.dumps(RECIPE))
    print(outdir / MODEL_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
