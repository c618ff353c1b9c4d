from __future__ import annotations

from hangwatch.redact import MASK
from hangwatch.redact import redact_argv
from hangwatch.redact import redact_environ
from hangwatch.redact import redact_text
from hangwatch.redact import redact_url


def test_argv_flags_with_separate_and_inline_values():
    argv = [
        "vllm",
        "serve",
        "m",
        "--api-key",
        "abc123",
        "--hf-token=hf_abcdefghijklmnopqrstuvwxyz",
        "--port",
        "8000",
    ]
    out = redact_argv(argv)
    assert out == ("vllm", "serve", "m", "--api-key", MASK, f"--hf-token={MASK}", "--port", "8000")


def test_tokenizer_flags_are_not_secrets():
    argv = ["--tokenizer", "meta/llama", "--max-num-batched-tokens", "2048", "--tokenizer-mode", "auto"]
    assert redact_argv(argv) == tuple(argv)


def test_url_userinfo_and_secret_query():
    assert (
        redact_url("http://user:pw@host:8000/health?token=abc&x=1")
        == f"http://{MASK}@host:8000/health?token={MASK}&x=1"
    )


def test_free_text():
    text = "export HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123 and Authorization: Bearer abcdefghijklmnop password=hunter2"
    out = redact_text(text)
    assert "hf_abcdefghij" not in out and "hunter2" not in out and "abcdefghijklmnop" not in out
    assert "tokens/s" in redact_text("Avg generation throughput: 12.0 tokens/s")


def test_environment():
    env = redact_environ({"HF_TOKEN": "x", "NCCL_DEBUG": "INFO", "AWS_SECRET_ACCESS_KEY": "y"})
    assert env == {"HF_TOKEN": MASK, "NCCL_DEBUG": "INFO", "AWS_SECRET_ACCESS_KEY": MASK}
