"""Secrets never reach the bucket or the image: the build context refuses a file that looks like a
secret by name or by content (JSON decoded, so escapes hide nothing), naming the file and the
rule, before anything is packed; public keys and ordinary files pass; .dockerignore's secret
rules are generated from the same Python list."""

from __future__ import annotations

import base64
import gzip
import io
import json
import re
from pathlib import Path

import pytest

from components import buildcontext, contextsecrets
from tests.ci.test_dockerfile import DOCKERIGNORE, dockerignore_patterns, sent
from tests.components.test_buildcontext import GIT, commit, copy_context, git, refused

pytestmark = pytest.mark.hardening  # make test-hardening

# Values that must never be echoed in a refusal.
TOKEN = "ya29.a0AfB_byC-Zq9vX3s"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
REFRESH = "1//0gLq3bYkQ2xWCgYIARAAGBASNwF"
CLIENT_SECRET = "GOCSPX-d-FL95Q19q7MQmFpd7hHD0Ty"
PRIVATE = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n-----END PRIVATE KEY-----\n"

SA_KEY = json.dumps(
    {
        "type": "service_account",
        "project_id": "p",
        "private_key_id": "0123",
        "private_key": PRIVATE,
        "client_email": "sa@p.iam.gserviceaccount.com",
    },
    indent=2,
)
# What `gcloud auth application-default login` writes.
AUTHORIZED_USER = json.dumps(
    {
        "account": "",
        "client_id": "764086051850-6qr4p6gpi6hn506pt8ejuq83di341hur.apps.googleusercontent.com",
        "client_secret": CLIENT_SECRET,
        "quota_project_id": "p",
        "refresh_token": REFRESH,
        "type": "authorized_user",
        "universe_domain": "googleapis.com",
    },
    indent=2,
)
EXTERNAL_ACCOUNT = json.dumps(
    {
        "type": "external_account",
        "audience": "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/providers/q",
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": "https://sts.googleapis.com/v1/token",
        "credential_source": {"file": "/var/run/token"},
    }
)
OAUTH_CLIENT = json.dumps(
    {"installed": {"client_id": "1.apps.googleusercontent.com", "client_secret": CLIENT_SECRET}}
)
DOCKER_LOGIN = base64.b64encode(b"_json_key:" + CLIENT_SECRET.encode()).decode()
KUBECONFIG = f"""apiVersion: v1
kind: Config
clusters:
- cluster: {{server: "https://1.2.3.4"}}
  name: c
users:
- name: u
  user:
    token: {TOKEN}
"""
KUBECONFIG_CERT = (
    "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    client-key-data: LS0tLS1CRUdJTg==\n"
)
PIP_CONF = f"[global]\nindex-url = https://oauth2accesstoken:{TOKEN}@europe-python.pkg.dev/p/r/simple/\n"


def escaped(text: str, *words: str) -> str:
    """`text` with the first underscore or letter of each of `words` written as a JSON escape."""
    for word in words:
        i = word.index("_") if "_" in word else 0
        text = text.replace(word, word[:i] + f"\\u{ord(word[i]):04x}" + word[i + 1 :])
    return text


# (file below trainer/, its content, what the refusal must say): each of these was packed,
# uploaded and copied into the image before the content rules and the new names.
SECRETS = [
    ("adc.json", AUTHORIZED_USER, 'application-default login` writes (rule: "type": "authorized_user")'),
    ("application_default.json", AUTHORIZED_USER, '"type": "authorized_user"'),
    ("settings.json", escaped(SA_KEY, "service_account"), '"type": "service_account"'),
    (
        "key.json",
        escaped(SA_KEY, "service_account", "private_key", "BEGIN"),
        "a Google service-account key",
    ),
    ("wif.json", EXTERNAL_ACCOUNT, '"type": "external_account"'),
    ("dup.json", '{"type": "service_account", "type": "other", "x": 1}', '"type": "service_account"'),
    ("tokens.json", json.dumps({"refresh_token": REFRESH}), 'JSON field "refresh_token"'),
    ("blob.json", json.dumps({"k": json.dumps({"private_key": "abc"})}), '"private_key"'),
    ("oauth.json", OAUTH_CLIENT, 'JSON field "client_secret"'),
    ("client_secret_1234.apps.googleusercontent.com.json", "{}", "name rule client_secret*.json"),
    ("utf16.json", None, '"type": "service_account"'),  # SA_KEY in UTF-16: NUL bytes, still text
    ("ndjson.txt", '{"a": 1}\n{"type": "authorized_user", "x": "y"}\n', '"type": "authorized_user"; line 2'),
    ("notes.txt", "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF\n", "a PGP private key block"),
    ("ed.txt", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n", "-----BEGIN OPENSSH PRIVATE KEY-----"),
    ("enc.txt", "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIF\n", "a PEM private key"),
    ("ec.txt", "x\n-----BEGIN EC PRIVATE KEY-----\nMHcC\n", "line 2"),
    ("putty.txt", "PuTTY-User-Key-File-3: ssh-ed25519\n", "a PuTTY private key"),
    ("blob.bin", None, "a PEM private key"),  # a key inside a binary file
    (".envrc", "export FOO=1\n", "name rule .envrc"),
    ("prod.env", "FOO=1\n", "name rule *.env"),
    ("credentials", "[default]\nregion = x\n", "name rule credentials"),
    ("aws.ini", f"[default]\naws_secret_access_key = {AWS_SECRET}\n", "AWS credentials"),
    ("aws.py", f'KEY = 1\naws_secret_access_key = "{AWS_SECRET}"\n', "aws_secret_access_key; line 2"),
    ("config", KUBECONFIG, 'setting named "token"; line 9'),
    ("cluster.yaml", KUBECONFIG_CERT, "a kubeconfig client key (rule: client-key-data:"),
    ("kubeconfig", "apiVersion: v1\n", "name rule kubeconfig"),
    ("pip.conf", "[global]\n", "name rule pip.conf"),
    ("index.cfg", PIP_CONF, "a URL with a password in it"),
    ("deps.py", f'INDEX = "https://user:{TOKEN}@example.com/simple"\n', "scheme://user:password@host"),
    ("netrc.txt", "machine example.com\n  login u\n  password hunter2\n", "netrc credentials"),
    (
        "upload.ini",
        "[pypi]\nusername = __token__\npassword = pypi-AgEIcHlwaS5vcmc\n",
        'setting named "password"; line 3',
    ),
    ("app.yaml", "db:\n  client_secret: s3cr3t\n", 'setting named "client_secret"'),
    (".pgpass", "db:5432:*:u:hunter2\n", "name rule .pgpass"),
    (".dockercfg", "{}", "name rule .dockercfg"),
    ("docker.json", json.dumps({"auths": {"gcr.io": {"auth": DOCKER_LOGIN}}}), 'JSON field "auths"'),
    ("registry.json", json.dumps({"https://gcr.io": {"auth": DOCKER_LOGIN}}), 'JSON field "auth"'),
    ("main.tfstate", "{}", "name rule *.tfstate"),
    ("main.tfstate.backup", "{}", "name rule *.tfstate.*"),
    ("state.json", '{"terraform_version": "1.7.0", "resources": []}', "a Terraform state"),
    ("maps.py", f'MAPS_KEY = "AIza{"Sy" + "b" * 33}"\n', "a Google API key"),
    (
        "explore.ipynb",
        json.dumps({"cells": [{"outputs": [{"text": [f"Bearer ya29.{'c0AfB_x' * 12}"]}]}]}),
        "a Google OAuth access token",
    ),
    ("accessTokens.json", "[]", "name rule accesstokens.json"),
    ("settings.yaml", None, "once base64-decoded"),  # a service-account key, base64-encoded
    ("adc.json.gz", None, "once gunzipped"),  # an ADC file, gzip'd
    # Archives: their members are not scanned, so none is packed (each holds user credentials).
    ("assets.zip", None, "zip archive"),
    ("assets.tar.gz", None, "tar archive, whose files cannot be checked for secrets once gunzipped"),
    ("assets.tar.xz", None, "xz archive"),
    ("assets.tar.bz2", None, "bzip2 archive"),
]


def archive(name: str) -> bytes:
    """`name`'s archive format holding Google user credentials (no PEM header) as adc.json."""
    import tarfile
    import zipfile

    buffer = io.BytesIO()
    if name.endswith(".zip"):
        with zipfile.ZipFile(buffer, "w") as z:
            z.writestr("adc.json", AUTHORIZED_USER)
    else:
        mode = {"gz": "w:gz", "xz": "w:xz", "bz2": "w:bz2"}[name.rsplit(".", 1)[1]]
        with tarfile.open(fileobj=buffer, mode=mode) as t:  # type: ignore[call-overload]
            info = tarfile.TarInfo("adc.json")
            info.size = len(AUTHORIZED_USER.encode())
            t.addfile(info, io.BytesIO(AUTHORIZED_USER.encode()))
    return buffer.getvalue()


def write(root: Path, name: str, body: str | None) -> Path:
    path = root / "trainer" / name
    if name == "utf16.json":
        path.write_bytes(SA_KEY.encode("utf-16"))
    elif name == "settings.yaml":
        path.write_text(f"gcp:\n  key_b64: {base64.b64encode(SA_KEY.encode()).decode()}\n")
    elif name == "adc.json.gz":
        path.write_bytes(gzip.compress(SA_KEY.encode()))
    elif name.startswith("assets."):
        path.write_bytes(archive(name))
    elif name == "blob.bin":
        path.write_bytes(b"\0\x01\x02" * 100 + PRIVATE.encode() + b"\0" * 10)
    else:
        assert body is not None
        path.write_text(body)
    return path


@pytest.mark.parametrize(("name", "body", "rule"), SECRETS, ids=[s[0] for s in SECRETS])
def test_a_secret_is_refused_naming_the_file_and_the_rule(
    tmp_path: Path, name: str, body: str | None, rule: str
) -> None:
    ctx = copy_context(tmp_path / "ctx")
    write(ctx, name, body)
    message = refused(ctx, f"trainer/{name}: its ", rule, "nothing was uploaded")
    for value in (TOKEN, AWS_SECRET, REFRESH, CLIENT_SECRET, "hunter2", "MIIEvQIBADANBg"):
        assert value not in message, "a refusal must not quote the secret"


# Files that are not secrets: a refusal here is a false alarm.
LEGITIMATE = [
    ("id_rsa.pub", "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 user@host\n"),
    ("deploy_key.PUB", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI user@host\n"),
    ("verify.txt", "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqh\n-----END PUBLIC KEY-----\n"),
    ("authorized_keys", "ssh-rsa AAAAB3NzaC1yc2E a\nssh-ed25519 AAAAC3Nz b\n"),
    ("ca.txt", "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+g\n-----END CERTIFICATE-----\n"),
    ("hparams.json", json.dumps({"epochs": 3, "type": "resnet", "pad_token": "[PAD]", "tokens": 5})),
    ("empty.json", json.dumps({"password": "", "api_key": "${API_KEY}", "client_secret": None})),
    ("types.json", json.dumps({"type": "authorized"}, indent=2)),
    ("auth.json", json.dumps({"auth": "none", "registry": "gcr.io"})),
    ("vocab.yaml", "tokenizer: bert\npad_token: '[PAD]'\nmax_tokens: 5\npassword: null\ntoken: ${TOKEN}\n"),
    (
        "login.py",
        (
            '"""Logs in.\n\nArgs:\n    password: the password, read from $PASSWORD; never a literal.\n'
            '    token: an OAuth token.\n"""\n\npassword: str = ""\ntoken = None\n'
            'URL = f"https://{user}:{password}@host/"\n'
        ),
    ),
    ("README.md", "password: see the docs; machine learning password rules\ntoken: none\n"),
    ("notes.txt", "A machine learning model; the password is never stored here.\n"),
    ("links.txt", "https://user@example.com/x http://localhost:8080/a@b ssh://git@github.com/o/r\n"),
    ("mask.cfg", "index-url = https://user:***@example.com/simple\n"),
    ("weights.bin", None),  # binary, with config-like bytes inside
]


@pytest.mark.parametrize(("name", "body"), LEGITIMATE, ids=[x[0] for x in LEGITIMATE])
def test_public_keys_and_ordinary_files_are_accepted(tmp_path: Path, name: str, body: str | None) -> None:
    ctx = copy_context(tmp_path / "ctx")
    path = ctx / "trainer" / name
    if body is None:
        path.write_bytes(b"\0\x89" + b"password = hunter2\ntoken: abc\n" + bytes(range(256)))
    else:
        path.write_text(body)
    members = dict(buildcontext.context_members(ctx))
    assert members[f"trainer/{name}"] == path.read_bytes()


def test_the_real_trainer_sources_pass_the_content_rules() -> None:
    """Every file of this checkout's context, through the content rules alone (no name rule)."""
    root = Path(__file__).resolve().parents[2]
    files = [root / n for n in buildcontext.CONTEXT_FILES]
    files += [p for p in (root / "trainer").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert len(files) > 10
    found = {p.name: contextsecrets.why_secret_content(p.name.lower(), p.read_bytes()) for p in files}
    assert {k: v for k, v in found.items() if v} == {}


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_in_git_every_tracked_secret_is_named_in_one_refusal(tmp_path: Path) -> None:
    ctx = copy_context(tmp_path / "repo")
    picked = ("adc.json", "notes.txt", "config", "index.cfg", ".pgpass")
    for name, body, _ in SECRETS:
        if name in picked:
            write(ctx, name, body)
    (ctx / "trainer" / "id_rsa.pub").write_text("ssh-rsa AAAAB3NzaC1yc2E a\n")
    git(ctx, "init", "-q")
    commit(ctx)
    message = refused(ctx, *(f"trainer/{n}" for n in picked))
    assert "id_rsa.pub" not in message


def test_a_private_key_in_a_pub_file_is_still_refused(tmp_path: Path) -> None:
    ctx = copy_context(tmp_path / "ctx")
    (ctx / "trainer" / "id_rsa.pub").write_text(PRIVATE)
    refused(ctx, "trainer/id_rsa.pub: its content looks like a PEM private key")


def test_content_scanning_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the text limit only private-key headers are looked for (over the whole file)."""
    monkeypatch.setattr(contextsecrets, "TEXT_SCAN_LIMIT", 1000)
    ctx = copy_context(tmp_path / "ctx")
    (ctx / "trainer" / "big.json").write_text(AUTHORIZED_USER + " " * 1000)
    assert "trainer/big.json" in dict(buildcontext.context_members(ctx))
    (ctx / "trainer" / "big.txt").write_text("x" * 5000 + PRIVATE)
    refused(ctx, "trainer/big.txt: its content looks like a PEM private key")
    monkeypatch.setattr(contextsecrets, "TEXT_SCAN_LIMIT", 1 << 20)
    (ctx / "trainer" / "big.txt").unlink()
    refused(ctx, "trainer/big.json", '"type": "authorized_user"')


def test_deeply_nested_json_is_read_as_text_not_a_crash(tmp_path: Path) -> None:
    ctx = copy_context(tmp_path / "ctx")
    (ctx / "trainer" / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (ctx / "trainer" / "deep2.json").write_text("[" * 100_000 + '{"refresh_token": "abc"}' + "]" * 100_000)
    refused(ctx, "trainer/deep2.json", "refresh_token")
    (ctx / "trainer" / "deep2.json").unlink()
    assert "trainer/deep.json" in dict(buildcontext.context_members(ctx))


# --- .dockerignore: the same list ------------------------------------------------------------------


def generated_block(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("# BEGIN generated secret rules")
    end = lines.index("# END generated secret rules")
    return lines[start + 1 : end]


def test_dockerignores_secret_rules_are_generated_from_the_python_lists() -> None:
    expected = buildcontext.dockerignore_secret_rules()
    assert generated_block(DOCKERIGNORE.read_text()) == expected, (
        ".dockerignore's secret rules differ from components/buildcontext.py's SECRET_NAMES and "
        "PUBLIC_NAMES: replace the block between its BEGIN/END lines with the output of "
        "`.venv/bin/python -m components.buildcontext --dockerignore`"
    )
    # The generated rules are the last: nothing after them lets a secret back in.
    rest = DOCKERIGNORE.read_text().split("# END generated secret rules", 1)[1]
    assert not [line for line in rest.splitlines() if line.strip() and not line.startswith("#")]


def example(pattern: str) -> str:
    return pattern.replace("*", "x")


@pytest.mark.parametrize("pattern", contextsecrets.SECRET_NAMES)
def test_dockerignore_and_the_context_refuse_the_same_names(pattern: str) -> None:
    rules = dockerignore_patterns(DOCKERIGNORE.read_text())
    for name in (example(pattern), example(pattern).upper()):
        refusal = contextsecrets.why_secret(f"trainer/{name}", b"harmless\n")
        assert refusal.startswith("its name looks like a secret"), (name, refusal)
        for path in (f"trainer/{name}", f"trainer/sub/{name}"):
            assert not sent(path, rules), f".dockerignore sends {path} ({pattern})"


@pytest.mark.parametrize(
    "name", ["id_rsa.pub", "ID_ED25519.PUB", "sub/deploy.pub", "task.py", "keys.py", "password.py"]
)
def test_dockerignore_and_the_context_accept_the_same_names(name: str) -> None:
    rules = dockerignore_patterns(DOCKERIGNORE.read_text())
    assert sent(f"trainer/{name}", rules)
    assert contextsecrets.why_secret(f"trainer/{name}", b"ssh-rsa AAAAB3 a\n") == ""


def test_public_keys_come_back_only_inside_the_context() -> None:
    rules = dockerignore_patterns(DOCKERIGNORE.read_text())
    assert not sent("id_rsa.pub", rules) and not sent("tests/id_rsa.pub", rules)


def test_the_generator_prints_the_block() -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "components.buildcontext", "--dockerignore"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.splitlines() == buildcontext.dockerignore_secret_rules()
    assert all(re.fullmatch(r"!?[\w*/.\-\[\]]+", line) for line in out.splitlines())


def test_a_refusal_packs_nothing(tmp_path: Path) -> None:
    ctx = copy_context(tmp_path / "ctx")
    (ctx / "trainer" / "adc.json").write_text(AUTHORIZED_USER)
    buf = io.BytesIO()
    with pytest.raises(ValueError, match=r"refusing(.|\n)*trainer/adc\.json"):
        buildcontext.write_context_tarball(ctx, buf)
    assert buf.getvalue() == b""
