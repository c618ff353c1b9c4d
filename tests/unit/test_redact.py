from __future__ import annotations

from hangwatch.redact import MASK
from hangwatch.redact import Redactor
from hangwatch.redact import redact_argv
from hangwatch.redact import redact_environ
from hangwatch.redact import redact_text
from hangwatch.redact import redact_url
from hangwatch.redact import secret_env_values


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


def test_secret_env_values_are_the_long_values_of_secret_names():
    env = {
        "MY_API_KEY": "abcdef-123456",
        "HF_TOKEN": "hf_short",
        "DB_PASSWORD": "correct-horse",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
        "TOKENIZERS_PARALLELISM": "false",  # not a secret, and would hide every "false"
        "TOKENIZER_PATH": "/models/tok/tokenizer.json",
        "SOME_KEY": "1",  # too short to mask anywhere
        "PATH": "/usr/bin:/bin",
    }
    assert set(secret_env_values(env)) == {
        "abcdef-123456",
        "hf_short",
        "correct-horse",
        "wJalrXUtnFEMI/K7MDENG",
    }


def test_redactor_masks_exact_values_wherever_they_appear():
    redact = Redactor({"MY_API_KEY": "abcdef-123456", "LONGER_TOKEN": "abcdef-123456-xyz"})
    assert redact("using abcdef-123456-xyz and abcdef-123456.") == "using *** and ***."
    assert redact("token hf_abcdefghijklmnopqrstuvwxyz0123") == "token ***"  # the known shapes too


def test_every_writer_redacts_every_field(monkeypatch):
    """JSON (the timeline's last_line, findings, phase lines, stacks' source lines), HTML, Markdown, text."""
    from builders import report_with
    from hangwatch import redact
    from hangwatch.render.html import html_report
    from hangwatch.render.json_report import json_text
    from hangwatch.render.json_report import report_to_dict
    from hangwatch.render.markdown import markdown_report
    from hangwatch.render.text import verdict_text

    secret = "v4lue-of-MY-API-KEY"
    monkeypatch.setenv("MY_API_KEY", secret)
    redact._process_redactor.cache_clear()
    try:
        report = report_with(f"key {secret} hf_abcdefghijklmnopqrstuvwxyz0123")
        data = report_to_dict(report)
        for text in (json_text(data), html_report(report), markdown_report(report), verdict_text(report)):
            assert secret not in text and "hf_abcdefghijklmnopqrstuvwxyz0123" not in text
        assert data["timeline"][0]["log"]["last_line"] == "last key *** ***"
        assert "***" in data["stacks"][0]["processes"][0]["threads"][0]["frames"][1]["code"]
    finally:
        monkeypatch.delenv("MY_API_KEY")
        redact._process_redactor.cache_clear()


# Secret shapes a server or a user's command may print: each value must be gone from the redacted line.
SECRETS = [
    ("token hf_Zq8RvT2mNx4LpW6yKc1BdF3hJs5GaE7u", "hf_Zq8RvT2mNx4LpW6yKc1BdF3hJs5GaE7u"),
    ("OPENAI_API_KEY is sk-proj-4fJ9kL2mN8pQ1rS5tU7vW3xY", "sk-proj-4fJ9kL2mN8pQ1rS5tU7vW3xY"),
    ("Authorization: Bearer abcdefghijklmnop", "abcdefghijklmnop"),
    ("curl -H 'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.x1y2z3'", "eyJhbGciOiJIUzI1NiJ9.e30.x1y2z3"),
    ("sent Basic dXNlcjpwYXNzd29yZA== to the proxy", "dXNlcjpwYXNzd29yZA=="),
    ("db password=hunter2 host=db", "hunter2"),
    ("password: hunter2", "hunter2"),
    ("Password: swordfish", "swordfish"),  # a plain word, but nothing of a sentence follows it
    ('api_key = "k-123 456"', "k-123 456"),
    ("using AKIAIOSFODNN7EXAMPLE in us-east-1", "AKIAIOSFODNN7EXAMPLE"),
    ("temporary ASIAY34FZKBOKMUTVV7A expires", "ASIAY34FZKBOKMUTVV7A"),
    ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG"),
    ("cloning https://oauth2:glpat-x7Y8z9AbCdEf@gitlab.example.com/repo.git", "glpat-x7Y8z9AbCdEf"),
    ("proxy http://alice:s3cret@proxy:3128 refused", "s3cret"),
    ("HF_TOKEN: hf_short123", "hf_short123"),
]

# Ordinary words next to a secret's name, or shaped like one: each must come out exactly as it went in.
INNOCENT = [
    "PermissionError: [Errno 13] Permission denied",
    "could not read token: Permission denied",  # was "token: *** denied"
    "open /root/.cache/huggingface/token: Permission denied",
    "token: h f _ a b c d e f",  # a spaced-out token was "token: *** f _ a b ..."
    "HF_TOKEN: not set, using anonymous access",
    "auth: denied",
    "password: none",
    "api_key: missing",
    "Avg generation throughput: 12.0 tokens/s, Running: 1 reqs",
    "token_count: 512",
    "max_token=4096 num_tokens=12 prompt_tokens: 30",
    "token_ids: [1, 2, 3]",
    "key=value",
    "log_level=info cache=on",
    "send a password reset link",
    "password reset: sent",
    "Basic configuration loaded",
    "bearer authentication is on",
    "the sk-learn pipeline",
    "ssh: Permission denied (publickey)",
]


def test_every_secret_shape_is_masked():
    for line, secret in SECRETS:
        out = redact_text(line)
        assert secret not in out and MASK in out, (line, out)


def test_ordinary_words_next_to_secret_names_survive():
    for line in INNOCENT:
        assert redact_text(line) == line


def test_a_name_followed_by_a_word_of_a_sentence_keeps_the_sentence():
    assert redact_text("could not read token: Permission denied") == "could not read token: Permission denied"
    assert redact_text("token: Permission") == f"token: {MASK}"  # nothing follows: it may be the value
    assert redact_text("password=Permission denied") == f"password={MASK} denied"  # `=` assigns
