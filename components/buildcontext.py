"""The trainer image's build context and its content tag (no KFP here: local components import
this module inside the KFP runtime, where `kfp.dsl` has no decorators)."""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import gzip
import io
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path

# The build context: what the Dockerfiles may COPY. Keep in step with .dockerignore.
# Dockerfile.serving (the custom serving image) is built from the same context.
CONTEXT_FILES = ("Dockerfile", "pyproject.toml", "uv.lock", "Dockerfile.serving")
CONTEXT_DIRS = ("trainer",)
_SKIP_PARTS = ("__pycache__",)
_SKIP_SUFFIXES = (".pyc", ".pyo")


def context_tag(members: Iterable[tuple[str, bytes]]) -> str:
    """The image tag for a build context: `src-` and 20 hex digits of a hash over the sorted
    (relative path, content) pairs. File order, timestamps and owners do not count."""

    import hashlib  # inside: shipped alone to the Vertex component (additional_funcs)

    outer = hashlib.sha256()
    for name, data in sorted(members):
        outer.update(name.encode() + b"\0" + hashlib.sha256(data).hexdigest().encode() + b"\n")
    return "src-" + outer.hexdigest()[:20]


def tarball_members(data: bytes) -> list[tuple[str, bytes]]:
    """The regular files of a (gzipped) context tarball as (relative path, content)."""
    import io
    import tarfile

    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for info in tar.getmembers():
            if info.isfile():
                f = tar.extractfile(info)
                name = info.name[2:] if info.name.startswith("./") else info.name
                out.append((name, f.read() if f else b""))
    return out


# --- secrets -----------------------------------------------------------------------------------
# A file of the context that looks like a secret, by name or by content, is refused, not silently
# left out: something meant it to be in the context, and a person should decide where it goes.
#
# Names that look like secrets, matched case-insensitively against a file's own name. This is the
# one list: .dockerignore's secret rules are generated from it (`python -m components.buildcontext
# --dockerignore`) and a test fails when they differ, so a plain `docker build` leaves out the same.
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
# (a private key in a `.pub` file is still refused). .dockerignore lets them back in below
# CONTEXT_DIRS.
PUBLIC_NAMES = ("*.pub",)

# Content is scanned whole for the byte patterns (private-key headers), and as text up to this
# size for the rest (JSON decoding, config files); the context is a few hundred KiB.
_TEXT_SCAN_LIMIT = 8 << 20
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
_PRIVATE_KEY = re.compile(rb"-----BEGIN ([A-Z0-9 ]{0,64})PRIVATE KEY( BLOCK)?-----")
_PRIVATE_KEY_TEXT = re.compile(_PRIVATE_KEY.pattern.decode())
_PUTTY_KEY = re.compile(rb"(?m)^PuTTY-User-Key-File-\d+:")
# (what it is, rule, pattern, where: "all" files or "config" files only: not Python or prose,
# where `password: str` is a parameter and not a password).
_TEXT_RULES: tuple[tuple[str, str, re.Pattern[str], str], ...] = (
    (
        "a Google credentials file",
        '"type": a Google credential type',
        re.compile(rf"""["']type["'][ \t\r\n]{{0,64}}:[ \t\r\n]{{0,64}}["']({_TYPES_RE})["']"""),
        "all",
    ),
    (
        "a secret field",
        "a JSON field holding a secret",
        re.compile(rf"""["']({_FIELDS_RE})["']\s{{0,64}}:\s{{0,64}}(?!{_PLACEHOLDER})["']""", re.IGNORECASE),
        "all",
    ),
    (
        "a Google API key",
        "AIza... (Google's API key form)",
        re.compile(r"(?<![\w-])AIza[0-9A-Za-z_-]{35}(?![\w-])"),
        "all",
    ),
    (
        "a Google OAuth access token",
        "ya29. (Google's access token form)",
        re.compile(r"(?<![\w.-])ya29\.[0-9A-Za-z_-]{20,}"),
        "all",
    ),
    (
        "AWS credentials",
        "aws_secret_access_key",
        re.compile(
            r"""(?im)^[ \t]*(?:export[ \t]+)?(aws_secret_access_key)[ \t]*[=:][ \t]*["']?[A-Za-z0-9/+=]{16}"""
        ),
        "all",
    ),
    (
        "a URL with a password in it",
        "scheme://user:password@host",
        re.compile(
            r"""\b[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s/:@"'<>]{0,256}:(?!\$|\{|<|%\(|\*+@)[^\s/@"'<>]+@[^\s/@"'<>]"""
        ),
        "all",
    ),
    (
        "a kubeconfig client key",
        "client-key-data:",
        re.compile(r"(?m)^[ \t]*(client-key-data)[ \t]*:[ \t]*\S"),
        "all",
    ),
    (
        "netrc credentials",
        "machine ... password ...",
        re.compile(r"\bmachine\s+\S+(?:\s+(?:login|account|port)\s+\S+)*\s+password\s+\S"),
        "config",
    ),
    (
        "a password or token setting",
        "a setting named like a password, secret, key or token",
        re.compile(
            r"""(?im)^[ \t-]*(?:export\s+)?["']?((?:[\w.-]*[_.-])?(?:password|passwd|secret|"""
            r"""secret[_-]?key|private[_-]?key|api[_-]?key|access[_-]?key|auth[_-]?token|"""
            r"""access[_-]?token|refresh[_-]?token|id[_-]?token)|token)["']?[ \t]*[=:][ \t]*"""
            r"""(?!(?:null|none|true|false|~)?[ \t]*$)(?!\$|\{|<|%\(|["']["'])\S"""
        ),
        "config",
    ),
)
# Python and prose: the "config" rules do not apply (`password: str` is an annotation there).
_CODE_OR_PROSE = (".py", ".pyi", ".md", ".rst")

# Git's variables that would point it at another repository than the checkout's own.
_GIT_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR")


def context_members(root: str | os.PathLike[str]) -> Iterator[tuple[str, bytes]]:
    """The build context of a checkout, as (relative path, content), in path order.

    In a git checkout the context is the files git tracks (`git ls-files`) among CONTEXT_FILES
    and below CONTEXT_DIRS, as they are in the working tree; files git does not track are left
    out, and named in one line on stderr when git does not ignore them (a module not yet
    `git add`ed is missing from the image). Where `root` is not a git checkout (Cloud Build hands
    its steps the source without .git; an unpacked tarball) or git is not installed, every file
    below CONTEXT_DIRS is taken instead, with the same rules:

    - caches (`__pycache__/`, `*.pyc`, `*.pyo`) are left out, as .dockerignore does;
    - a symlink is never followed out of the checkout: one whose target resolves outside it is
      refused. One whose target is itself a member of the context is taken with that file's
      content (the tarball holds regular files only); any other symlink (to a folder, to a file
      outside the context or left out of it, dangling) is refused, as is a path that goes
      through a symlinked folder;
    - anything that is not a regular file where a file is expected (a folder named like a file,
      a FIFO, a socket, a device) is refused;
    - a file that looks like a secret is refused: by name (SECRET_NAMES, matched case-insensitively;
      a public key's `*.pub` name is not), or by content, whatever its name: any
      `-----BEGIN ... PRIVATE KEY-----` header (PEM, OpenSSH, encrypted, PGP's `PRIVATE KEY
      BLOCK`) or PuTTY key; a Google credential file (`"type"` service_account, authorized_user,
      external_account, ...); a JSON field holding a secret (private_key, refresh_token,
      client_secret, password, ...), JSON decoded so escapes and repeated keys hide nothing;
      Docker's `auths`/`auth` logins; a Terraform state; `aws_secret_access_key`; a URL with a
      password (`https://user:token@host`, as pip.conf holds); a kubeconfig's
      `client-key-data`; and, outside Python and prose, netrc entries and settings named like a
      password, secret, key or token (`token:`, `password =`). Placeholders (`$VAR`, `${VAR}`,
      `{name}`, `<...>`) are not secrets. Public keys (`BEGIN PUBLIC KEY`, `ssh-rsa AAAA...`)
      pass. Private-key headers are looked for in every file; the rest in text files up to
      _TEXT_SCAN_LIMIT (a binary file is one with a NUL byte that is not UTF-16/32 text).

    A refusal is a ValueError naming every offending file and what to do, raised before the
    first member is yielded, so nothing is packed or uploaded."""
    yield from _collect(Path(root))


def _collect(base: Path) -> list[tuple[str, bytes]]:
    missing = [name for name in (*CONTEXT_FILES, *CONTEXT_DIRS) if not os.path.lexists(base / name)]
    if missing:
        raise ValueError(
            f"build context {base} lacks {', '.join(missing)}; it needs {', '.join(CONTEXT_FILES)} "
            f"and the folders {', '.join(CONTEXT_DIRS)}/"
        )
    problems: list[str] = []
    for folder in CONTEXT_DIRS:
        if os.path.islink(base / folder) or not (base / folder).is_dir():
            problems.append(f"{folder}: must be a folder in the checkout (not a file, not a symlink)")
    if problems:
        raise _refusal(base, problems)

    tracked = _git_files(base, "--cached")
    names: Iterable[str]
    if tracked is None:
        names = _walk(base)
    else:
        untracked_files = [n for n in CONTEXT_FILES if n not in tracked]
        if untracked_files:
            raise ValueError(
                f"build context {base}: {', '.join(untracked_files)} not tracked by git; the context "
                f"is what git tracks, so `git add` {'it' if len(untracked_files) == 1 else 'them'}"
            )
        names = tracked
        untracked = sorted(n for n in _git_files(base, "--others", "--exclude-standard") or () if _kept(n))
        if untracked:
            shown = ", ".join(untracked[:10]) + (
                f" and {len(untracked) - 10} more" if len(untracked) > 10 else ""
            )
            print(
                f"build context {base}: left out {len(untracked)} file(s) git does not track: {shown}"
                " (`git add` what the image needs)",
                file=sys.stderr,
            )

    real_base = os.path.realpath(base)
    files: dict[str, bytes] = {}
    links: dict[str, str] = {}  # symlink -> its target, relative to the checkout
    for name in sorted(n for n in names if _kept(n)):
        path = base / name
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue  # tracked, but deleted in the working tree: not in the context
        real = os.path.realpath(path)
        inside = real == real_base or real.startswith(real_base.rstrip(os.sep) + os.sep)
        if stat.S_ISLNK(mode):
            if not inside:
                problems.append(
                    f"{name}: a symlink to {real}, outside the checkout; symlinks are never followed "
                    "out of it: put the file itself in the checkout or remove the link"
                )
            else:
                links[name] = Path(os.path.relpath(real, real_base)).as_posix()
        elif os.path.normcase(real) != os.path.normcase(os.path.join(real_base, name)):
            problems.append(
                f"{name}: its path goes through a symlinked folder (to {real}); "
                "put the folder itself in the checkout or remove the link"
            )
        elif not stat.S_ISREG(mode):
            problems.append(
                f"{name}: not a regular file ({_kind(mode)}); the context holds files only: remove "
                "it or move it out of the context"
            )
        else:
            files[name] = path.read_bytes()
    for name, target in links.items():
        if target in files:
            files[name] = files[target]
        else:
            problems.append(
                f"{name}: a symlink to {target}, which is not itself a file of the build context; "
                "put the file itself there or remove the link"
            )

    for name, data in sorted(files.items()):
        problem = _secret(name, data)
        if problem:
            target = f" (the symlink's target {links[name]})" if name in links else ""
            problems.append(
                f"{name}{target}: {problem}; secrets must never reach the image: remove it, or move it "
                "out of the context (and out of git: `git rm --cached`), and pass it at run time instead"
            )
    if problems:
        raise _refusal(base, problems)
    return sorted(files.items())


def _kept(name: str) -> bool:
    """Whether a context path survives the cache rules .dockerignore also has."""
    parts = name.split("/")
    return not set(parts) & set(_SKIP_PARTS) and not parts[-1].endswith(_SKIP_SUFFIXES)


def _git_files(base: Path, *which: str) -> set[str] | None:
    """`git ls-files -z` for the context's paths, relative to `base`; None where `base` is not in
    a git checkout or git is not installed."""
    env = {k: v for k, v in os.environ.items() if k not in _GIT_ENV}
    env["LC_ALL"] = "C"  # git's messages untranslated: "not a git repository" is looked for
    specs = [*CONTEXT_FILES, *(f"{d}/" for d in CONTEXT_DIRS)]
    cmd = ["git", "--literal-pathspecs", "-C", str(base), "ls-files", "-z", *which, "--", *specs]
    try:
        proc = subprocess.run(cmd, capture_output=True, env=env, check=False)
    except OSError:  # no git here: the source is all there is
        return None
    if proc.returncode != 0:
        error = proc.stderr.decode(errors="replace").strip()
        if "not a git repository" in error:
            return None
        raise ValueError(f"build context {base}: `git ls-files` failed: {error}")
    listed = {os.fsdecode(n) for n in proc.stdout.split(b"\0") if n}
    # A pathspec `Dockerfile` also matches `Dockerfile/x`: keep exactly the context's paths.
    return {n for n in listed if n in CONTEXT_FILES or n.startswith(tuple(f"{d}/" for d in CONTEXT_DIRS))}


def _walk(base: Path) -> list[str]:
    """Every non-folder path below CONTEXT_DIRS (symlinked folders included, not followed)."""
    names = list(CONTEXT_FILES)
    for folder in CONTEXT_DIRS:
        for top, dirs, filenames in os.walk(base / folder, followlinks=False):
            rel = Path(top).relative_to(base).as_posix()
            names += [f"{rel}/{d}" for d in dirs if os.path.islink(os.path.join(top, d))]
            dirs[:] = sorted(
                d for d in dirs if d not in _SKIP_PARTS and not os.path.islink(os.path.join(top, d))
            )
            names += [f"{rel}/{f}" for f in filenames]
    return names


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((kind for test, kind in kinds if test(mode)), "not a file")


def _secret(name: str, data: bytes) -> str:
    """Why `name` looks like a secret, naming the rule that matched, or "" where it does not. The
    message never quotes the secret itself (a line number at most)."""
    base = name.rsplit("/", 1)[-1].lower()
    if not any(fnmatch.fnmatchcase(base, p) for p in PUBLIC_NAMES):
        matched = [p for p in SECRET_NAMES if fnmatch.fnmatchcase(base, p)]
        if matched:
            return f"its name looks like a secret (name rule {matched[0]})"
    return _secret_content(base, data)


def _secret_content(base: str, data: bytes, depth: int = 0) -> str:
    found = _secret_content_as_is(base, data)
    if found or depth >= 2:
        return found
    # A secret gzip'd, or written in base64 (a key pasted into a config, an ADC file compressed):
    # judged again once decoded, two layers at most and within the scan limit.
    if data[:2] == b"\x1f\x8b":
        import zlib

        with contextlib.suppress(OSError, EOFError, zlib.error):
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
                inner = f.read(_TEXT_SCAN_LIMIT)
            found = _secret_content(base.removesuffix(".gz"), inner, depth + 1)
            return f"{found} once gunzipped" if found else ""
    text = _text(data) if len(data) <= _TEXT_SCAN_LIMIT else None
    for blob in _BASE64.findall(text or ""):
        with contextlib.suppress(ValueError):
            found = _secret_content(base, base64.b64decode(blob + "=" * (-len(blob) % 4)), depth + 1)
            if found:
                return f"{found} once base64-decoded"
    return ""


# A run of base64 long enough to hold a key or a credential file (a short one is any word).
_BASE64 = re.compile(r"[A-Za-z0-9+/]{120,}={0,2}")


def _secret_content_as_is(base: str, data: bytes) -> str:
    text = _text(data) if len(data) <= _TEXT_SCAN_LIMIT else None
    if text is not None and text.lstrip().startswith(("{", "[")):
        found = _json_secret(text)  # first: a credential file says what it is
        if found:
            return f"its content looks like {found}"
    # Private-key headers: over the whole file, text or binary, however large.
    key = _PRIVATE_KEY.search(data)
    if key:
        return _private_key(key.group().decode(), _line(data, key.start()))
    if _PUTTY_KEY.search(data):
        return "its content looks like a PuTTY private key (rule: PuTTY-User-Key-File-)"
    if text is None:  # binary, or past the limit: only the headers above are looked for
        return ""
    return _text_secret(text, config=not base.endswith(_CODE_OR_PROSE))


def _text(data: bytes) -> str | None:
    """The file as text (UTF-8, or UTF-16/32 where it says so), or None where it is binary."""
    head = data[:8192]
    if b"\0" in head:
        encoding = json.detect_encoding(head)  # UTF-16/32, with or without a BOM
        if not encoding.startswith("utf-16") and not encoding.startswith("utf-32"):
            return None
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            return None
    return data.decode("utf-8-sig", errors="replace")


class _Pairs(list[tuple[str, object]]):
    """A JSON object as all its (key, value) pairs: a repeated key cannot hide an earlier one."""


def _json_secret(text: str) -> str:
    """What a JSON document holds that is a secret, with the field that says so; "" where nothing
    (or where it is not one JSON document: then the text rules read it, escapes resolved)."""
    try:
        doc = json.loads(text, object_pairs_hook=_Pairs)
    except (ValueError, RecursionError):
        return ""
    if isinstance(doc, _Pairs):
        keys = {k for k, _ in doc}
        if {"terraform_version", "resources"} <= keys:
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
            if key in _SECRET_FIELDS and isinstance(value, str) and not _placeholder(value):
                return f'a secret field (rule: JSON field "{raw_key}")'
            if key == "auths" and isinstance(value, _Pairs) and value:
                return 'a Docker registry config with credentials (rule: JSON field "auths")'
            if key == "auth" and isinstance(value, str) and _basic_auth(value):
                return f'a Docker registry login (rule: JSON field "auth" under "{parent}")'
            stack.append((value, raw_key))
    return ""


def _placeholder(value: str) -> bool:
    value = value.strip()
    return not value or value.startswith(("$", "{", "<", "%("))


def _basic_auth(value: str) -> bool:
    """Whether `value` is base64 of `user:password`, as Docker's config stores a login."""
    import base64
    import binascii

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
    for what, rule, pattern, where in _TEXT_RULES:
        if where == "config" and not config:
            continue
        match = pattern.search(text)
        if match:
            if what == "a Google credentials file":
                what, rule = _GOOGLE_TYPES[match[1].lower()], f'"type": "{match[1]}"'
            if what == "a secret field":
                rule = f'JSON field "{match[1]}"'
            elif what == "a password or token setting":
                rule = f'a setting named "{match[1]}"'
            line = text.count("\n", 0, match.start()) + 1
            return f"its content looks like {what} (rule: {rule}; line {line})"
    return ""


def _private_key(header: str, line: int) -> str:
    what = "a PGP private key block" if "PGP" in header else "a PEM private key"
    return f"its content looks like {what} (rule: {header}; line {line})"


def _line(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def dockerignore_secret_rules() -> list[str]:
    """.dockerignore's secret rules, from SECRET_NAMES and PUBLIC_NAMES: each name excluded at any
    depth, letters matched in either case (Docker matches case-sensitively; the context does not),
    public keys let back in below CONTEXT_DIRS."""

    def either_case(pattern: str) -> str:
        return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in pattern)

    return [
        *(f"**/{either_case(p)}" for p in SECRET_NAMES),
        *(f"!{d}/**/{either_case(p)}" for d in CONTEXT_DIRS for p in PUBLIC_NAMES),
    ]


def _refusal(base: Path, problems: list[str]) -> ValueError:
    lines = "\n".join(f"  - {p}" for p in problems)
    return ValueError(f"build context {base}: refusing to pack it, nothing was uploaded:\n{lines}")


def write_context_tarball(root: str | os.PathLike[str], out: io.BufferedIOBase | str) -> str:
    """Packs the build context into a reproducible .tar.gz; returns its `context_tag`."""
    members = list(context_members(root))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))

    payload = gzip.compress(buf.getvalue(), mtime=0)
    if isinstance(out, str):
        Path(out).write_bytes(payload)
    else:
        out.write(payload)
    return context_tag(members)


if __name__ == "__main__":
    if sys.argv[1:] != ["--dockerignore"]:
        sys.exit("usage: python -m components.buildcontext --dockerignore")
    print("\n".join(dockerignore_secret_rules()))
