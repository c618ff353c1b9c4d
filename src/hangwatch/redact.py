"""Remove secrets from command lines, environments, URLs and free text before anything is shown or stored.

Applied at the collection boundary (so no sample ever holds a secret), and by every writer to every
string it writes (``scrub``: the JSON, HTML and Markdown reports, the verdict and the other texts, the
live view's lines):
known token shapes (``hf_...``, ``sk-...``, bearer headers, ``token=...``) and the exact values of the
secret-named environment variables (``*TOKEN*``, ``*KEY*``, ``*SECRET*``, ``*PASSWORD*``) that
hangwatch passes to the tree it launches (its own environment), wherever they appear.

Only what is a secret goes: after a colon a word of a sentence stays ("token: Permission denied"), and a
name about a secret (``token_count``, ``HF_TOKEN_PATH``) is not a secret's name.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from urllib.parse import parse_qsl
from urllib.parse import urlencode
from urllib.parse import urlsplit
from urllib.parse import urlunsplit

MASK = "***"

# Names that hold secrets, as flags (--api-key), env vars (HF_TOKEN) or query keys (?token=).
_SENSITIVE_WORDS = (
    r"(?:token|secret|passw(?:or)?d|passwd|api[_-]?key|apikey|access[_-]?key|auth|credential"
    r"|private[_-]?key|signature|sig)"
)
_FLAG = re.compile(rf"(?i)^--?[\w.-]*{_SENSITIVE_WORDS}[\w.-]*$")
_FLAG_WITH_VALUE = re.compile(rf"(?i)^(--?[\w.-]*{_SENSITIVE_WORDS}[\w.-]*)=(.+)$")
_ASSIGNMENT = re.compile(
    rf"(?i)\b([\w.-]*{_SENSITIVE_WORDS}[\w.-]*)(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&\"']+)"
)
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/@\s:]+)(?::([^/@\s]*))?@")
# An authorization scheme and its credential. Outside an Authorization header the same two words are
# English ("Basic configuration", "bearer authentication"): there only a credential-shaped word counts.
_BEARER = re.compile(r"(?i)(\bauthorization\s*[:=]\s*)?\b(bearer|basic)\s+([A-Za-z0-9._~+/=-]{8,})")
MIN_BARE_CREDENTIAL = 20  # a run of letters this long is no English word
# Well-known token shapes that can appear anywhere (HF, OpenAI-style, GitHub, AWS long-term and temporary
# key ids, Slack).
_TOKEN_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|xox[abpr]-[A-Za-z0-9-]{10,})\b"
)
# After "token:" or "password:" (a colon: prose as often as a setting), what is a word of the sentence
# and not the value: "could not read token: Permission denied", "HF_TOKEN: not set", a token printed
# spaced out ("token: h f _ a b"). A value is one word, of letters only, cased as words are, with more
# words after it; or one of the words that say a value is absent. Anything else there is masked.
_PROSE_WORD = re.compile(r"[A-Za-z]|[a-z]{2,15}|[A-Z][a-z]{1,14}")
_NEXT_WORD = re.compile(r"[ \t]+[A-Za-z_(]")
_ABSENT_WORDS = frozenset(
    {"none", "null", "nil", "missing", "unset", "empty", "invalid", "expired", "denied", "required",
     "revoked", "not", "no", "true", "false"}
)  # fmt: skip


_SECRET_PARTS = frozenset(
    {
        "token",
        "secret",
        "password",
        "passwd",
        "pwd",
        "apikey",
        "credential",
        "credentials",
        "auth",
        "authorization",
    }
)
_KEY_QUALIFIERS = frozenset({"api", "access", "private", "secret", "hf", "openai", "signing", "encryption"})
# Parts that make a secret's name the name of something about it: how many tokens (token_count,
# max_token, token_ids), where it is kept (HF_TOKEN_PATH). Their values are numbers and paths.
_NOT_THE_SECRET = frozenset(
    {"count", "counts", "num", "len", "length", "ids", "limit", "max", "min", "budget", "usage", "size",
     "total", "per", "path", "file", "dir"}
)  # fmt: skip


def is_secret_name(name: str) -> bool:
    """True for HF_TOKEN, api_key, --hf-token, NCCL_SOCKET_PASSWORD; false for --tokenizer, max_tokens."""
    parts = set(re.split(r"[^a-z0-9]+", name.lower())) - {""}
    if parts & _NOT_THE_SECRET:
        return False
    if parts & _SECRET_PARTS:
        return True
    return "key" in parts and bool(parts & _KEY_QUALIFIERS)


def redact_argv(argv: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Redact the values of secret flags (``--api-key X``, ``--hf-token=X``) and secrets inside args."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        with_value = _FLAG_WITH_VALUE.match(arg)
        if with_value and is_secret_name(with_value.group(1)):
            out.append(f"{with_value.group(1)}={MASK}")
            continue
        if _FLAG.match(arg) and is_secret_name(arg):
            out.append(arg)
            hide_next = True
            continue
        out.append(redact_text(arg))
    return tuple(out)


def redact_url(url: str) -> str:
    """Drop user:password@ and the values of secret query parameters."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, MASK if is_secret_name(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str) -> str:
    """Best-effort redaction of secrets in free text (log lines, error messages)."""
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    text = _BEARER.sub(_credential, text)
    text = _TOKEN_SHAPES.sub(MASK, text)
    return _ASSIGNMENT.sub(_assignment, text)


def _credential(m: re.Match[str]) -> str:
    header, scheme, credential = m.group(1), m.group(2), m.group(3)
    if header is None and credential.isalpha() and len(credential) < MIN_BARE_CREDENTIAL:
        return m.group(0)  # "Basic configuration": a word, not a credential
    return f"{header or ''}{scheme} {MASK}"


def _assignment(m: re.Match[str]) -> str:
    name, sep, value = m.group(1), m.group(2), m.group(3)
    if not is_secret_name(name):
        return m.group(0)
    if "=" not in sep and _is_prose(value, m.string, m.end()):
        return m.group(0)
    return f"{name}{sep}{MASK}"


def _is_prose(value: str, text: str, end: int) -> bool:
    """True when ``value``, after ``name:``, is a word of a sentence rather than the secret itself."""
    if value.lower() in _ABSENT_WORDS or value.lower() in ("bearer", "basic"):
        return True  # a scheme is not the secret: its credential, after it, was masked (_BEARER)
    return bool(_PROSE_WORD.fullmatch(value)) and bool(_NEXT_WORD.match(text, end))


def redact_environ(env: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret_name(k) else redact_text(v)) for k, v in env.items()}


# Names of environment variables whose values are secrets wherever they show up (a server printing its
# HF_TOKEN). Matched as substrings of the upper-cased name, as a person reads *TOKEN*; the words below
# contain them and are not secrets (TOKENIZERS_PARALLELISM=false must not hide every "false").
_SECRET_ENV_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD")
_NOT_SECRET_WORDS = ("TOKENIZER", "KEYBOARD", "KEYRING", "KEYMAP", "KEYTIMEOUT")
MIN_SECRET_VALUE = 8  # shorter values ("1", "true", "auto") would hide ordinary words everywhere


def is_secret_env_name(name: str) -> bool:
    upper = name.upper()
    for word in _NOT_SECRET_WORDS:
        upper = upper.replace(word, "")
    return any(word in upper for word in _SECRET_ENV_WORDS)


def secret_env_values(env: Mapping[str, str]) -> tuple[str, ...]:
    """The values of the secret-named variables of ``env``, longest first (so a value that contains
    another is masked whole)."""
    values = {
        v.strip()
        for k, v in env.items()
        if is_secret_env_name(k) and len(v.strip()) >= MIN_SECRET_VALUE and v.strip().lower() not in _PLAIN
    }
    return tuple(sorted(values, key=len, reverse=True))


_PLAIN = frozenset({"true", "false", "enabled", "disabled"})
_MEMO_LIMIT = 100_000
_MEMO_TEXT_LIMIT = 4096


class Redactor:
    """The one redactor of every writer: exact secret values, then the known shapes (``redact_text``)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.values = secret_env_values(env)
        # A report repeats the same strings tick after tick (names, command lines): redact each once.
        self._memo: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        done = self._memo.get(text)
        if done is not None:
            return done
        out = text
        for value in self.values:
            if value in out:
                out = out.replace(value, MASK)
        out = redact_text(out)
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        if len(text) <= _MEMO_TEXT_LIMIT:
            self._memo[text] = out
        return out


@functools.cache
def _process_redactor() -> Redactor:
    return Redactor(os.environ)


def scrub(text: str) -> str:
    """Redact ``text`` for writing: the secrets of hangwatch's environment (which the tree it launches
    inherits) and the known token shapes."""
    return _process_redactor()(text)
