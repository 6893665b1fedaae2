"""Files of the build context that look like secrets, by name or by content
(`components.buildcontext` refuses them: a person should decide where they go)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import fnmatch
import gzip
import io
import json
import re
import zlib

# Names that look like secrets, matched case-insensitively against a file's own name (refused, not
# silently left out: something meant the file to be in the context). .dockerignore's secret rules
# are generated from it (`python -m components.buildcontext --dockerignore`; a test compares).
SECRET_NAMES = (
    # private keys and key stores
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.ppk",
    "*.jks",
    "*.keystore",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    # environment files
    ".env",
    ".env.*",
    "*.env",
    ".envrc",
    # Google: service-account keys, `gcloud auth application-default login`'s file, OAuth clients,
    # gcloud's own credential stores
    "*credentials*.json",
    "*service-account*.json",
    "*service_account*.json",
    "client_secret*.json",
    "credentials.db",
    "access_tokens.db",
    # Azure CLI's token caches
    "accesstokens.json",
    "msal_token_cache.*",
    # AWS (`~/.aws/credentials`), Kubernetes, Docker, Postgres, Terraform
    "credentials",
    "kubeconfig",
    "kubeconfig.yaml",
    "kubeconfig.yml",
    "*.kubeconfig",
    ".dockercfg",
    ".pgpass",
    "*.tfstate",
    "*.tfstate.*",
    # package indexes and git
    ".netrc",
    "_netrc",
    ".npmrc",
    ".pypirc",
    "pip.conf",
    "pip.ini",
    ".git-credentials",
)
# Public keys: a name matching these is not refused for its name (`id_rsa.pub`), only by content
# (a private key in a `.pub` file is still refused).
PUBLIC_NAMES = ("*.pub",)

# Content is scanned whole for private-key headers, and as text up to this size for the rest.
TEXT_SCAN_LIMIT = 8 << 20
# Google credential files' "type", as google.auth reads them.
_GOOGLE_TYPES = {
    "service_account": "a Google service-account key",
    "authorized_user": "Google user credentials, as `gcloud auth application-default login` writes",
    "external_account": "a Google workload identity federation credential",
    "external_account_authorized_user": "Google workforce identity federation user credentials",
    "impersonated_service_account": "Google impersonated service-account credentials",
    "gdch_service_account": "a Google Distributed Cloud service-account key",
}
# JSON fields that hold a secret when their value is a non-empty string (keys compared lowercased,
# `-` read as `_`).
_SECRET_FIELDS = frozenset(
    {
        "private_key",
        "refresh_token",
        "client_secret",
        "password",
        "passwd",
        "access_token",
        "auth_token",
        "api_key",
        "apikey",
        "identitytoken",
        "registrytoken",
        "aws_secret_access_key",
        "secret_access_key",
        "client_key_data",
    }
)
_TYPES_RE = "|".join(_GOOGLE_TYPES)
_FIELDS_RE = "|".join(sorted(_SECRET_FIELDS)).replace("_", "[_-]")
# A quoted value that stands for a secret rather than being one: `$VAR`, `${VAR}`, `{name}`,
# `<...>`, `%(name)s`, or nothing.
_PLACEHOLDER = r"""["'](?:\$|\{|<|%\(|["']|\s)"""
_PLACEHOLDER_VALUE = re.compile(r"\s*(?:$|[${<]|%\()")  # the same of a JSON value: blank, or so begun
_PRIVATE_KEY = re.compile(rb"-----BEGIN ([A-Z0-9 ]{0,64})PRIVATE KEY( BLOCK)?-----")
_PRIVATE_KEY_TEXT = re.compile(_PRIVATE_KEY.pattern.decode())
_PUTTY_KEY = re.compile(rb"(?m)^PuTTY-User-Key-File-\d+:")
# (what it is, rule: filled with the match's groups, pattern); those of _CONFIG_ONLY apply to config
# files only: not _CODE_OR_PROSE.
_TEXT_RULES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    (
        "a Google credentials file",
        '"type": "{0}"',
        re.compile(rf"""["']type["'][ \t\r\n]{{0,64}}:[ \t\r\n]{{0,64}}["']({_TYPES_RE})["']"""),
    ),
    (
        "a secret field",
        'JSON field "{0}"',
        re.compile(rf"""["']({_FIELDS_RE})["']\s{{0,64}}:\s{{0,64}}(?!{_PLACEHOLDER})["']""", re.IGNORECASE),
    ),
    (
        "a Google API key",
        "AIza... (Google's API key form)",
        re.compile(r"(?<![\w-])AIza[0-9A-Za-z_-]{35}(?![\w-])"),
    ),
    (
        "a Google OAuth access token",
        "ya29. (Google's access token form)",
        re.compile(r"(?<![\w.-])ya29\.[0-9A-Za-z_-]{20,}"),
    ),
    (
        "AWS credentials",
        "aws_secret_access_key",
        re.compile(
            r"""(?im)^[ \t]*(?:export[ \t]+)?(aws_secret_access_key)[ \t]*[=:][ \t]*["']?[A-Za-z0-9/+=]{16}"""
        ),
    ),
    (
        "a URL with a password in it",
        "scheme://user:password@host",
        re.compile(
            r"""\b[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s/:@"'<>]{0,256}:(?!\$|\{|<|%\(|\*+@)[^\s/@"'<>]+@[^\s/@"'<>]"""
        ),
    ),
    (
        "a kubeconfig client key",
        "client-key-data:",
        re.compile(r"(?m)^[ \t]*(client-key-data)[ \t]*:[ \t]*\S"),
    ),
    (
        "netrc credentials",
        "machine ... password ...",
        re.compile(r"\bmachine\s+\S+(?:\s+(?:login|account|port)\s+\S+)*\s+password\s+\S"),
    ),
    (
        "a password or token setting",
        'a setting named "{0}"',
        re.compile(
            r"""(?im)^[ \t-]*(?:export\s+)?["']?((?:[\w.-]*[_.-])?(?:password|passwd|secret|"""
            r"""secret[_-]?key|private[_-]?key|api[_-]?key|access[_-]?key|auth[_-]?token|"""
            r"""access[_-]?token|refresh[_-]?token|id[_-]?token)|token)["']?[ \t]*[=:][ \t]*"""
            r"""(?!(?:null|none|true|false|~)?[ \t]*$)(?!\$|\{|<|%\(|["']["'])\S"""
        ),
    ),
)
_CONFIG_ONLY = ("netrc credentials", "a password or token setting")
# Python and prose: _CONFIG_ONLY's rules do not apply (`password: str` is an annotation there).
_CODE_OR_PROSE = (".py", ".pyi", ".md", ".rst")


def why_secret(name: str, data: bytes) -> str:
    """Why `name` looks like a secret, naming the rule that matched, or "" where it does not. The
    message never quotes the secret itself (a line number at most)."""
    base = name.rsplit("/", 1)[-1].lower()
    if not any(fnmatch.fnmatchcase(base, p) for p in PUBLIC_NAMES):
        matched = [p for p in SECRET_NAMES if fnmatch.fnmatchcase(base, p)]
        if matched:
            return f"its name looks like a secret (name rule {matched[0]})"
    return why_secret_content(base, data)


def why_secret_content(base: str, data: bytes, depth: int = 0) -> str:
    text = _text(data) if len(data) <= TEXT_SCAN_LIMIT else None
    if text is not None and text.lstrip().startswith(("{", "[")):
        found = _json_secret(text)  # first: a credential file says what it is
        if found:
            return f"its content looks like {found}"
    # Private-key headers: over the whole file, text or binary, however large.
    key = _PRIVATE_KEY.search(data)
    if key:
        return _private_key(key.group().decode(), data.count(b"\n", 0, key.start()) + 1)
    if _PUTTY_KEY.search(data):
        return "its content looks like a PuTTY private key (rule: PuTTY-User-Key-File-)"
    # Binary, or past the limit: only the headers above are looked for.
    found = "" if text is None else _text_secret(text, config=not base.endswith(_CODE_OR_PROSE))
    if found or depth >= 2:
        return found
    # An archive's members are not scanned: it could carry any secret into the image.
    for kind, magic, at in _ARCHIVES:
        if data[at : at + len(magic)] == magic:
            return f"its content is a {kind} archive, whose files cannot be checked for secrets"
    # A secret gzip'd or in base64 is judged again once decoded, two layers at most.
    if data[:2] == b"\x1f\x8b":
        with contextlib.suppress(OSError, EOFError, zlib.error):
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
                inner = f.read(TEXT_SCAN_LIMIT)
            found = why_secret_content(base.removesuffix(".gz"), inner, depth + 1)
            return f"{found} once gunzipped" if found else ""
    for blob in _BASE64.findall(text or ""):
        with contextlib.suppress(ValueError):
            found = why_secret_content(base, base64.b64decode(blob + "=" * (-len(blob) % 4)), depth + 1)
            if found:
                return f"{found} once base64-decoded"
    return ""


# Archive formats by their magic numbers (gzip is opened above: a gzip'd tar is a tar within).
_ARCHIVES = (
    ("zip", b"PK\x03\x04", 0),
    ("tar", b"ustar", 257),
    ("bzip2", b"BZh", 0),
    ("xz", b"\xfd7zXZ\x00", 0),
    ("7z", b"7z\xbc\xaf\x27\x1c", 0),
    ("zstd", b"\x28\xb5\x2f\xfd", 0),
)


# A run of base64 long enough to hold a key or a credential file (a short one is any word).
_BASE64 = re.compile(r"[A-Za-z0-9+/]{120,}={0,2}")


def _text(data: bytes) -> str | None:
    """The file as text (UTF-8, or UTF-16/32 where it says so), or None where it is binary."""
    if b"\0" not in data[:8192]:
        return data.decode("utf-8-sig", errors="replace")
    encoding = json.detect_encoding(data[:8192])  # UTF-16/32, with or without a BOM
    try:
        return None if encoding.startswith("utf-8") else data.decode(encoding)
    except UnicodeDecodeError:
        return None


class _Pairs(list[tuple[str, object]]):
    """A JSON object as all its (key, value) pairs: a repeated key cannot hide an earlier one."""


def _json_secret(text: str) -> str:
    """What a JSON document holds that is a secret, with the field that says so; "" where nothing
    (or where it is not one JSON document: then the text rules read it, escapes resolved)."""
    try:
        doc = json.loads(text, object_pairs_hook=_Pairs)
    except (ValueError, RecursionError):
        return ""
    if isinstance(doc, _Pairs) and {"terraform_version", "resources"} <= {k for k, _ in doc}:
        return 'a Terraform state (rule: JSON fields "terraform_version" and "resources")'
    stack: list[tuple[object, str]] = [(doc, "")]
    while stack:
        node, parent = stack.pop()
        if isinstance(node, str):
            found = _text_secret(node, config=False)
            if found:
                return found.removeprefix("its content looks like ").replace(
                    "; line ", "; in a JSON string, line "
                )
            continue
        if isinstance(node, list) and not isinstance(node, _Pairs):
            stack.extend((item, parent) for item in node)
            continue
        if not isinstance(node, _Pairs):
            continue
        for raw_key, value in node:  # the credential type first: it says the most
            if raw_key.lower() == "type" and isinstance(value, str) and value.lower() in _GOOGLE_TYPES:
                return f'{_GOOGLE_TYPES[value.lower()]} (rule: "type": "{value}")'
        for raw_key, value in node:
            key = raw_key.lower().replace("-", "_")
            if key in _SECRET_FIELDS and isinstance(value, str) and not _PLACEHOLDER_VALUE.match(value):
                return f'a secret field (rule: JSON field "{raw_key}")'
            if key == "auths" and isinstance(value, _Pairs) and value:
                return 'a Docker registry config with credentials (rule: JSON field "auths")'
            if key == "auth" and isinstance(value, str) and _basic_auth(value):
                return f'a Docker registry login (rule: JSON field "auth" under "{parent}")'
            stack.append((value, raw_key))
    return ""


def _basic_auth(value: str) -> bool:
    """Whether `value` is base64 of `user:password`, as Docker's config stores a login."""
    try:
        return b":" in base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False


_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})|\\(/)")


def _text_secret(text: str, config: bool) -> str:
    """The first text rule the file matches, read with `\\uXXXX`, `\\xXX` and `\\/` escapes
    resolved (a key written with escapes in JSON or a Python string is still that key)."""
    if "\\" in text:
        text = _ESCAPE.sub(lambda m: chr(int(m[1] or m[2], 16)) if (m[1] or m[2]) else m[3], text)
    key = _PRIVATE_KEY_TEXT.search(text)
    if key:
        return _private_key(key.group(), text.count("\n", 0, key.start()) + 1)
    for what, rule, pattern in _TEXT_RULES:
        if what in _CONFIG_ONLY and not config:
            continue
        match = pattern.search(text)
        if match:
            if what == "a Google credentials file":
                what = _GOOGLE_TYPES[match[1].lower()]
            line = text.count("\n", 0, match.start()) + 1
            return f"its content looks like {what} (rule: {rule.format(*match.groups())}; line {line})"
    return ""


def _private_key(header: str, line: int) -> str:
    what = "a PGP private key block" if "PGP" in header else "a PEM private key"
    return f"its content looks like {what} (rule: {header}; line {line})"
