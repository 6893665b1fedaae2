"""What goes into the trainer image's build context: the files git tracks (every file, where
there is no git), never a symlink out of the checkout, never anything that looks like a secret."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import types
from pathlib import Path

import pytest

from components import buildcontext, contextsecrets
from local import steps
from tests.ci.test_dockerfile import DOCKERIGNORE, dockerignore_patterns, sent

ROOT = Path(__file__).resolve().parents[2]
GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="git is not installed")

SERVICE_ACCOUNT_KEY = """{
  "type": "service_account",
  "project_id": "p",
  "private_key_id": "0123",
  "private_key": "-----BEGIN PRIVATE KEY-----\\nMIIE...\\n-----END PRIVATE KEY-----\\n",
  "client_email": "sa@p.iam.gserviceaccount.com"
}
"""
PEM_KEY = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow...\n-----END RSA PRIVATE KEY-----\n"


def git(repo: Path, *args: str) -> str:
    """git in `repo`, blind to the user's own configuration (a global excludes file, signing)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    identity = ["-c", "user.email=test@example.com", "-c", "user.name=Test", "-c", "commit.gpgsign=false"]
    return subprocess.run(
        ["git", *identity, "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout


def copy_context(dest: Path) -> Path:
    """A copy of this checkout's real build context (caches left out), without git."""
    dest.mkdir(parents=True)
    for name in buildcontext.CONTEXT_FILES:
        shutil.copy(ROOT / name, dest / name)
    for folder in buildcontext.CONTEXT_DIRS:
        shutil.copytree(
            ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__", "*.py[co]")
        )
    return dest


def commit(repo: Path) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "context")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git checkout holding a copy of the real context, all of it committed."""
    if GIT is None:
        pytest.skip("git is not installed")
    ctx = copy_context(tmp_path / "repo")
    git(ctx, "init", "-q")
    commit(ctx)
    return ctx


def names(root: Path) -> list[str]:
    return [name for name, _ in buildcontext.context_members(root)]


def tarball_names(root: Path) -> set[str]:
    buf = io.BytesIO()
    buildcontext.write_context_tarball(root, buf)
    return {name for name, _ in buildcontext.tarball_members(buf.getvalue())}


def tracked(root: Path) -> list[str]:
    specs = [*buildcontext.CONTEXT_FILES, *(f"{d}/" for d in buildcontext.CONTEXT_DIRS)]
    listed = git(root, "ls-files", "-z", "--", *specs).split("\0")
    return sorted(n for n in listed if n and "__pycache__" not in n and not n.endswith((".pyc", ".pyo")))


def refused(root: Path, *named: str) -> str:
    """The refusal's message, checked to name each of `named` and to have packed nothing."""
    out = io.BytesIO()
    with pytest.raises(ValueError, match="refusing") as error:
        buildcontext.write_context_tarball(root, out)
    assert out.getvalue() == b""
    message = str(error.value)
    for name in named:
        assert name in message, message
    return message


# --- git: only what git tracks -------------------------------------------------------------------


@needs_git
def test_the_real_checkouts_context_is_exactly_its_tracked_files() -> None:
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode:
        pytest.skip("this checkout has no .git (Cloud Build hands its steps the source without it)")
    assert names(ROOT) == tracked(ROOT)
    assert tarball_names(ROOT) == set(tracked(ROOT))


def test_a_copy_in_git_has_the_tracked_files_only(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (repo / "trainer" / "notes.txt").write_text("scratch\n")
    (repo / "trainer" / "__pycache__").mkdir()
    (repo / "trainer" / "__pycache__" / "task.cpython-311.pyc").write_bytes(b"\0cache")
    assert names(repo) == tracked(repo)
    assert "trainer/task.py" in names(repo)
    assert "trainer/notes.txt" not in tarball_names(repo)
    note = capsys.readouterr().err
    assert "left out 1 file(s) git does not track: trainer/notes.txt" in note
    assert "__pycache__" not in note
    # Once added (not even committed), it is in.
    git(repo, "add", "trainer/notes.txt")
    assert "trainer/notes.txt" in tarball_names(repo)


def test_untracked_python_code_is_refused_not_left_out(repo: Path) -> None:
    """A local run imports it from the checkout; the image, made of what git tracks, would not
    have it, and the jobs on Vertex would fail after the build."""
    (repo / "trainer" / "helper.py").write_text("VALUE = 1\n")
    with pytest.raises(ValueError, match=r"trainer/helper\.py not tracked by git"):
        names(repo)


def test_an_untracked_secret_is_simply_left_out(repo: Path) -> None:
    (repo / "trainer" / "credentials.json").write_text(SERVICE_ACCOUNT_KEY)
    (repo / "trainer" / ".env").write_text("TOKEN=x\n")
    assert names(repo) == tracked(repo)


def test_a_context_file_git_does_not_track_is_named(repo: Path) -> None:
    git(repo, "rm", "-q", "--cached", "uv.lock")
    with pytest.raises(ValueError, match=r"uv\.lock not tracked by git"):
        names(repo)


def test_a_tracked_file_deleted_in_the_working_tree_is_not_sent(repo: Path) -> None:
    (repo / "trainer" / "synthetic.py").unlink()
    assert "trainer/synthetic.py" not in names(repo)


def test_tag_and_tarball_depend_on_content_only(tmp_path: Path, repo: Path) -> None:
    other = copy_context(tmp_path / "other")
    for path in sorted(other.rglob("*"), reverse=True):
        os.utime(path, (1_000_000, 1_000_000))
    git(other, "init", "-q")
    commit(other)
    first, second = io.BytesIO(), io.BytesIO()
    tag = buildcontext.write_context_tarball(repo, first)
    assert buildcontext.write_context_tarball(other, second) == tag
    assert first.getvalue() == second.getvalue(), "the tarball must be reproducible"
    assert buildcontext.context_tag(buildcontext.tarball_members(first.getvalue())) == tag


# --- secrets ----------------------------------------------------------------------------------------


def test_a_tracked_service_account_key_is_refused_by_name_and_content(repo: Path) -> None:
    (repo / "trainer" / "credentials.json").write_text(SERVICE_ACCOUNT_KEY)
    commit(repo)
    message = refused(repo, "trainer/credentials.json", "remove it, or move it out of the context")
    assert "nothing was uploaded" in message


@pytest.mark.parametrize(
    "name",
    [
        ".env",
        ".env.production",
        "server.pem",
        "tls.KEY",
        "cert.p12",
        "cert.pfx",
        "id_rsa",
        "id_rsa.bak",
        "id_ed25519",
        "gcp-credentials.json",
        "my-service-account.json",
        "deploy_service_account.json",
        ".netrc",
        ".npmrc",
        ".pypirc",
        "sub/.env",
    ],
)
def test_a_tracked_file_named_like_a_secret_is_refused(repo: Path, name: str) -> None:
    path = repo / "trainer" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("harmless\n")
    commit(repo)
    refused(repo, f"trainer/{name}", "its name looks like a secret")


@pytest.mark.parametrize(
    ("name", "body", "what"),
    [
        ("settings.json", SERVICE_ACCOUNT_KEY, "a Google service-account key"),
        ("notes.txt", "keep this:\n" + PEM_KEY, "a PEM private key"),
        ("embedded.py", 'KEY = """-----BEGIN OPENSSH PRIVATE KEY-----\n..."""\n', "a PEM private key"),
        ("Dockerfile", None, "a PEM private key"),
    ],
)
def test_content_that_looks_like_a_secret_is_refused_whatever_its_name(
    repo: Path, name: str, body: str | None, what: str
) -> None:
    path = repo / name if name in buildcontext.CONTEXT_FILES else repo / "trainer" / name
    path.write_text(body if body is not None else path.read_text() + "# " + PEM_KEY)
    commit(repo)
    rel = path.relative_to(repo).as_posix()
    refused(repo, f"{rel}: its content looks like {what}")


def test_what_only_mentions_keys_is_not_refused(repo: Path) -> None:
    (repo / "trainer" / "doc.py").write_text(
        '"""Reads "private_key" from the service account JSON; "type" must be "authorized_user"."""\n'
        "BEGIN = '-----BEGIN CERTIFICATE-----'\n"
    )
    (repo / "trainer" / "keys.py").write_text("KEYS = ['a']\n")
    commit(repo)
    assert {"trainer/doc.py", "trainer/keys.py"} <= set(names(repo))


def test_every_problem_is_named_in_one_refusal(repo: Path) -> None:
    (repo / "trainer" / ".env").write_text("TOKEN=x\n")
    (repo / "trainer" / "credentials.json").write_text(SERVICE_ACCOUNT_KEY)
    os.symlink("/etc/hostname", repo / "trainer" / "link.py")
    commit(repo)
    refused(repo, "trainer/.env", "trainer/credentials.json", "trainer/link.py")


# --- symlinks and files that are not regular files ---------------------------------------------------


def test_a_symlink_out_of_the_checkout_is_refused(repo: Path) -> None:
    os.symlink("/etc/hostname", repo / "trainer" / "link.py")
    commit(repo)
    message = refused(repo, "trainer/link.py", "outside the checkout")
    assert "symlinks are never followed" in message


def test_a_relative_symlink_climbing_out_of_the_checkout_is_refused(tmp_path: Path, repo: Path) -> None:
    (tmp_path / "secret.py").write_text("TOKEN = 'x'\n")
    os.symlink("../../secret.py", repo / "trainer" / "secret.py")
    commit(repo)
    refused(repo, "trainer/secret.py", "outside the checkout")


def test_a_symlink_to_a_file_of_the_context_is_sent_as_that_files_content(repo: Path) -> None:
    os.symlink("task.py", repo / "trainer" / "alias.py")
    commit(repo)
    members = dict(buildcontext.context_members(repo))
    assert members["trainer/alias.py"] == (repo / "trainer" / "task.py").read_bytes()
    buf = io.BytesIO()
    buildcontext.write_context_tarball(repo, buf)
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
        assert tar.getmember("trainer/alias.py").isfile(), "the tarball holds regular files only"


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("../README.md", "not itself a file of the build context"),  # in the checkout, not the context
        ("../trainer", "not itself a file of the build context"),  # a folder
        ("missing.py", "not itself a file of the build context"),  # dangling
    ],
)
def test_any_other_symlink_inside_the_checkout_is_refused(repo: Path, target: str, why: str) -> None:
    (repo / "README.md").write_text("readme\n")
    os.symlink(target, repo / "trainer" / "link")
    commit(repo)
    refused(repo, "trainer/link", why)


def test_a_symlink_to_an_untracked_file_of_the_context_is_refused(repo: Path) -> None:
    (repo / "trainer" / "local.txt").write_text("X = 1\n")
    os.symlink("local.txt", repo / "trainer" / "alias.txt")
    git(repo, "add", "trainer/alias.txt")
    refused(repo, "trainer/alias.txt", "not itself a file of the build context")


def test_a_path_through_a_symlinked_folder_is_refused(tmp_path: Path, repo: Path) -> None:
    (repo / "trainer" / "sub").mkdir()
    (repo / "trainer" / "sub" / "mod.py").write_text("X = 1\n")
    commit(repo)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "mod.py").write_text("TOKEN = 'x'\n")
    shutil.rmtree(repo / "trainer" / "sub")
    os.symlink(outside, repo / "trainer" / "sub")
    refused(repo, "trainer/sub/mod.py", "symlinked folder")


def test_the_context_folder_itself_must_not_be_a_symlink(tmp_path: Path) -> None:
    ctx = copy_context(tmp_path / "ctx")
    shutil.move(ctx / "trainer", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", ctx / "trainer")
    refused(ctx, "trainer: must be a folder")


def test_a_folder_where_a_file_is_tracked_is_refused(repo: Path) -> None:
    (repo / "trainer" / "model.py").unlink()
    (repo / "trainer" / "model.py").mkdir()
    refused(repo, "trainer/model.py: not a regular file (a folder)")


# --- no git: every file, the same refusals -----------------------------------------------------------


def test_without_git_every_file_is_sent_but_caches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx = copy_context(tmp_path / "ctx")
    (ctx / "trainer" / "notes.txt").write_text("scratch\n")
    (ctx / "trainer" / "__pycache__").mkdir()
    (ctx / "trainer" / "__pycache__" / "task.cpython-311.pyc").write_bytes(b"\0cache")
    expected = sorted(
        [
            *buildcontext.CONTEXT_FILES,
            *(p.relative_to(ctx).as_posix() for p in (ctx / "trainer").rglob("*") if p.is_file()),
        ]
    )
    expected = [n for n in expected if "__pycache__" not in n]
    assert "trainer/notes.txt" in expected and "trainer/task.py" in expected
    assert names(ctx) == expected
    assert tarball_names(ctx) == set(expected)
    assert "git does not track" not in capsys.readouterr().err
    if GIT is not None:  # the same files as a checkout of them gives, but the untracked note
        git(ctx, "init", "-q")
        git(ctx, "add", "-A")
        assert names(ctx) == expected


def test_without_git_secrets_and_symlinks_out_are_still_refused(tmp_path: Path) -> None:
    ctx = copy_context(tmp_path / "ctx")
    (ctx / "trainer" / "credentials.json").write_text(SERVICE_ACCOUNT_KEY)
    (ctx / "trainer" / ".env").write_text("TOKEN=x\n")
    (ctx / "trainer" / "conf").mkdir()
    (ctx / "trainer" / "conf" / "blob.json").write_text(SERVICE_ACCOUNT_KEY)
    os.symlink("/etc/hostname", ctx / "trainer" / "link.py")
    os.symlink("/etc", ctx / "trainer" / "etc")
    refused(
        ctx,
        "trainer/credentials.json",
        "trainer/.env",
        "trainer/conf/blob.json: its content looks like a Google service-account key",
        "trainer/link.py",
        "trainer/etc: a symlink to /etc",
    )


def test_without_git_an_inside_symlink_to_a_context_file_is_its_content(tmp_path: Path) -> None:
    ctx = copy_context(tmp_path / "ctx")
    os.symlink("task.py", ctx / "trainer" / "alias.py")
    members = dict(buildcontext.context_members(ctx))
    assert members["trainer/alias.py"] == members["trainer/task.py"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_without_git_a_file_name_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    ctx = copy_context(tmp_path / "ctx")
    with open(os.path.join(os.fsencode(ctx / "trainer"), b"bad\xff.py"), "wb") as f:
        f.write(b"X = 1\n")
    refused(ctx, "trainer/bad", "not UTF-8")


def test_without_git_a_fifo_is_refused_not_read(tmp_path: Path) -> None:
    ctx = copy_context(tmp_path / "ctx")
    os.mkfifo(ctx / "trainer" / "pipe")
    refused(ctx, "trainer/pipe: not a regular file (a FIFO)")


def test_without_git_a_folder_named_like_a_context_file_is_refused(tmp_path: Path) -> None:
    ctx = copy_context(tmp_path / "ctx")
    (ctx / "uv.lock").unlink()
    (ctx / "uv.lock").mkdir()
    refused(ctx, "uv.lock: not a regular file (a folder)")


# --- every user of the context gets the rules ----------------------------------------------------------


def test_the_local_check_refuses_the_same(repo: Path) -> None:
    tag = steps.check_build_context.python_func(context_dir=str(repo), repository="local/repo")
    assert tag.tag == buildcontext.context_tag(buildcontext.context_members(repo))
    (repo / "trainer" / "credentials.json").write_text(SERVICE_ACCOUNT_KEY)
    commit(repo)
    with pytest.raises(ValueError, match=r"trainer/credentials\.json"):
        steps.check_build_context.python_func(context_dir=str(repo), repository="local/repo")


def test_nothing_is_uploaded_when_the_context_is_refused(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import google.cloud.storage as storage

    from launch import submit

    def no_client(*args: object, **kwargs: object) -> None:
        raise AssertionError("the storage client must not be made for a refused context")

    monkeypatch.setattr(storage, "Client", no_client)
    (repo / "trainer" / ".env").write_text("TOKEN=x\n")
    commit(repo)
    settings = types.SimpleNamespace(project="p", bucket="b", pipeline_root="gs://b/root")
    with pytest.raises(ValueError, match=r"trainer/\.env"):
        submit.upload_context(settings, root=repo)  # type: ignore[arg-type]


def test_dockerignore_keeps_the_same_secret_names_out() -> None:
    rules = dockerignore_patterns(DOCKERIGNORE.read_text())
    for pattern in contextsecrets.SECRET_NAMES:
        example = pattern.replace("*", "x")
        for path in (f"trainer/{example}", f"trainer/sub/{example}"):
            assert not sent(path, rules), f".dockerignore sends {path} ({pattern})"
    assert sent("trainer/task.py", rules) and sent("trainer/sub/keys.py", rules)
