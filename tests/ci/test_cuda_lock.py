"""The trainer image's CUDA comes from the lock: every library folder TensorFlow's shared
libraries name in their RUNPATHs is provided by a package of uv.lock's `gpu` group, pinned at the
version TensorFlow's own `and-cuda` extra names, for the CUDA TensorFlow was built with.

TF 2.21's Linux wheel (the same wheel the CPU environment here installs) loads CUDA, cuDNN, NCCL
and the CUDA math libraries with dlopen, found through the RUNPATHs of its .so files
(`$ORIGIN/../nvidia/<library>/lib`, into the nvidia-* wheels). A folder no locked wheel provides
is a library TF looks for and cannot find in the image: the GPU is then not registered and the
job would train on the CPU (trainer.task refuses to, at start). Read from the installed wheel and
the lock alone: nothing is downloaded and TensorFlow is not imported.
"""

from __future__ import annotations

import importlib.metadata
import mmap
import os
import re
import shutil
import struct
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.ci.tools import ROOT

PROJECT = "vertex-multiworker-training"
LINUX_X86_64 = "platform_machine == 'x86_64' and sys_platform == 'linux'"
# RUNPATH folders TF names that no locked package provides, on purpose, with the reason.
OPTIONAL = {
    "tensorrt": "TF-TRT: TF 2.21 is not a TensorRT build (build_info is_tensorrt_build False)",
    "nvidia/nvshmem/lib": "XLA's experimental NVSHMEM collectives, opt-in and not in TF's own "
    "and-cuda extra; MultiWorkerMirroredStrategy's collectives are NCCL's",
}


def elf_runpaths(path: Path) -> list[str]:
    """The DT_RUNPATH and DT_RPATH entries of a 64-bit little-endian ELF shared object, read from
    its section headers (what `readelf -d` shows), without loading it."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as elf:
        if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        (shoff,) = struct.unpack_from("<Q", elf, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
        found = []
        for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
            if sh_type != 6:  # SHT_DYNAMIC
                continue
            strtab = sections[link][4]
            for at in range(offset, offset + size, entsize or 16):
                tag, value = struct.unpack_from("<qQ", elf, at)
                if tag == 0:  # DT_NULL
                    break
                if tag in (15, 29):  # DT_RPATH, DT_RUNPATH
                    end = elf.find(b"\0", strtab + value)
                    found += elf[strtab + value : end].decode().split(":")
        return found


def tensorflow_dir() -> Path:
    files = importlib.metadata.distribution("tensorflow").locate_file("tensorflow")
    return Path(str(files))


def runpath_folders(package_dir: Path) -> set[str]:
    """The folders outside the package the RUNPATHs of its .so files point into, relative to
    site-packages (`nvidia/cudnn/lib`, `tensorrt`)."""
    folders: set[str] = set()
    for so in package_dir.rglob("*.so*"):
        if not so.is_file() or so.is_symlink():
            continue
        for entry in elf_runpaths(so):
            match = re.search(r"\$ORIGIN/(?:\.\./)+((?:nvidia/[a-z_]+/lib)|tensorrt)$", entry)
            if match:
                folders.add(match.group(1))
    return folders


def package_for(folder: str) -> str:
    """The nvidia-* wheel that installs `nvidia/<library>/lib` (NVIDIA's naming for CUDA 12:
    nvidia/cuda_runtime/lib is nvidia-cuda-runtime-cu12's)."""
    match = re.fullmatch(r"nvidia/([a-z_]+)/lib", folder)
    return f"nvidia-{match.group(1).replace('_', '-')}-cu12" if match else ""


def lock() -> dict:
    return tomllib.loads((ROOT / "uv.lock").read_text())


def gpu_group(locked: dict) -> dict[str, dict]:
    """The `gpu` dependency group as the lock declares it: {name: its requirement}."""
    project = next(p for p in locked["package"] if p["name"] == PROJECT)
    return {r["name"]: r for r in project["metadata"]["requires-dev"]["gpu"]}


def locked_versions(locked: dict) -> dict[str, str]:
    return {p["name"]: p["version"] for p in locked["package"]}


def unprovided(folders: set[str], group: dict[str, dict], versions: dict[str, str]) -> list[str]:
    """Each RUNPATH folder no locked package of the group provides (less OPTIONAL), with why."""
    missing = []
    for folder in sorted(folders - set(OPTIONAL)):
        name = package_for(folder)
        if not name:
            missing.append(f"{folder}: no nvidia-* package is known to provide it")
        elif name not in group:
            missing.append(f"{folder}: {name} is not in the gpu dependency group")
        elif name not in versions:
            missing.append(f"{folder}: {name} is in the gpu group but not locked")
        elif group[name].get("marker") != LINUX_X86_64:
            missing.append(f"{folder}: {name} is not limited to Linux x86_64 ({group[name].get('marker')})")
    return missing


@pytest.fixture(scope="module")
def folders() -> set[str]:
    return runpath_folders(tensorflow_dir())


def test_the_runpaths_are_read(folders: set[str]) -> None:
    """What TF 2.21's wheel names (the check below is only worth something if this holds)."""
    assert {"nvidia/cudnn/lib", "nvidia/nccl/lib", "nvidia/cuda_runtime/lib", "nvidia/cublas/lib"} <= folders


def test_every_runpath_library_is_locked_for_linux_x86_64(folders: set[str]) -> None:
    locked = lock()
    missing = unprovided(folders, gpu_group(locked), locked_versions(locked))
    assert missing == [], "uv.lock's gpu group does not provide:\n" + "\n".join(missing)


def test_a_missing_library_is_found() -> None:
    """The check fails on a folder the lock does not provide, or provides for every platform."""
    locked = lock()
    group = gpu_group(locked)
    versions = locked_versions(locked)
    assert unprovided({"nvidia/cudnn/lib", "nvidia/cusparselt/lib"}, group, versions) == [
        "nvidia/cusparselt/lib: nvidia-cusparselt-cu12 is not in the gpu dependency group"
    ]
    anywhere = {**group, "nvidia-cudnn-cu12": {**group["nvidia-cudnn-cu12"], "marker": None}}
    assert unprovided({"nvidia/cudnn/lib"}, anywhere, versions) == [
        "nvidia/cudnn/lib: nvidia-cudnn-cu12 is not limited to Linux x86_64 (None)"
    ]


def test_the_optional_folders_are_still_named_by_tensorflow(folders: set[str]) -> None:
    """An exception that no longer applies is dropped, not kept as a blind spot."""
    assert set(OPTIONAL) <= folders


def and_cuda_floors() -> dict[str, str]:
    """TensorFlow's `and-cuda` extra: {package: the version its `>=` names}."""
    floors = {}
    for requirement in importlib.metadata.requires("tensorflow") or []:
        if 'extra == "and-cuda"' not in requirement:
            continue
        match = re.match(r"^([A-Za-z0-9_.-]+)[^;]*>=\s*([0-9][0-9.]*)", requirement)
        assert match, requirement
        floors[match.group(1).lower()] = match.group(2)
    return floors


def test_the_gpu_group_is_tensorflows_and_cuda_extra_at_its_floor() -> None:
    """Exactly TF's own extra, each package at the version TF names as its floor: the CUDA 12.5 /
    cuDNN 9.3 release TF 2.21 was built against, not the newest 12.x a resolver would pick."""
    locked = lock()
    floors = and_cuda_floors()
    group = gpu_group(locked)
    versions = locked_versions(locked)
    assert floors, "tensorflow's metadata names no and-cuda extra"
    assert set(group) - {"tensorflow"} == set(floors), sorted(set(group) ^ set(floors))
    for name, floor in floors.items():
        assert group[name].get("specifier") == f"=={floor}", (name, group[name], floor)
        assert versions[name] == floor, (name, versions[name])
    assert group["tensorflow"].get("extras") == ["and-cuda"], group["tensorflow"]
    assert versions["tensorflow"] == importlib.metadata.version("tensorflow")


def build_info() -> dict:
    """TF's build_info, read from its generated module's text (no TensorFlow import)."""
    text = (tensorflow_dir() / "python" / "platform" / "build_info.py").read_text()
    return {k: v for k, v in re.findall(r"\('(\w+)', '([^']*)'\)", text)}


def test_the_locked_cuda_and_cudnn_are_those_tensorflow_was_built_for() -> None:
    info = build_info()
    versions = locked_versions(lock())
    cuda = ".".join(info["cuda_version"].split(".")[:2])
    assert versions["nvidia-cuda-runtime-cu12"].startswith(cuda + "."), (
        info,
        versions["nvidia-cuda-runtime-cu12"],
    )
    assert versions["nvidia-cudnn-cu12"].split(".")[0] == info["cudnn_version"], info


def test_make_test_and_make_run_stay_on_cpu() -> None:
    """The gpu group is not a default group: the CPU environment never installs ~3 GB of CUDA."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "gpu" in pyproject["dependency-groups"]
    assert "gpu" not in pyproject["tool"]["uv"]["default-groups"]


# --- what the gpu group costs a CPU job: the cpu and trainer images' wheels ----------------------


def locked_wheel_bytes(*groups: str) -> int:
    """The compressed download of the dependency `groups` as the images install them: `uv export
    --frozen` of those groups (as the Dockerfile's stages run it), each package's wheel for
    CPython 3.11 on manylinux x86_64 (the image's python:3.11-slim-bookworm, glibc 2.36) as
    uv.lock records its `size`, or its sdist when it has no such wheel. Not the image's size:
    wheels are zip files, and only a real build shows the installed bytes and the base's.
    `python -m tests.ci.test_cuda_lock` prints the figures docs/vertex.md#the-trainer-image states."""
    from packaging import tags
    from packaging.requirements import Requirement
    from packaging.utils import parse_wheel_filename

    uv = shutil.which("uv") or os.path.expanduser("~/.local/bin/uv")  # where the Makefile looks
    command = [uv, "export", "--quiet", "--frozen", "--no-emit-project", "--no-hashes", "--no-header"]
    for group in groups:
        command += ["--only-group", group]
    out = subprocess.run(
        [*command, "--no-annotate"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    ).stdout
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    supported = [
        *tags.cpython_tags((3, 11), platforms=platforms),
        *tags.compatible_tags((3, 11), "cp311", platforms),
    ]
    rank = {tag: n for n, tag in enumerate(supported)}
    environment = {"sys_platform": "linux", "platform_machine": "x86_64", "platform_system": "Linux"}
    environment |= {"python_version": "3.11", "python_full_version": "3.11.0", "os_name": "posix"}
    packages = {(p["name"], p.get("version")): p for p in lock()["package"]}
    total = 0
    for line in filter(None, map(str.strip, out.splitlines())):
        requirement = Requirement(line)
        if requirement.marker and not requirement.marker.evaluate(environment):
            continue
        [version] = [spec.version for spec in requirement.specifier]
        package = packages[(requirement.name, version)]
        fitting = [
            (min(rank.get(tag, len(rank)) for tag in parse_wheel_filename(w["url"].rsplit("/", 1)[1])[3]), w)
            for w in package.get("wheels", [])
        ]
        fit, wheel = min(fitting, key=lambda pair: pair[0], default=(len(rank), None))
        total += (wheel if wheel and fit < len(rank) else package["sdist"])["size"]
    return total


def megabytes(size: int) -> str:
    return f"{size / 1e6:,.0f} MB"


def test_the_cpu_image_leaves_out_the_gpu_groups_download() -> None:
    """The figures docs/vertex.md#the-trainer-image states are this lock's, and the gpu group is
    most of the GPU image's download (the reason the CPU jobs get an image without it)."""
    cpu, gpu = locked_wheel_bytes("trainer"), locked_wheel_bytes("trainer", "gpu")
    assert gpu - cpu > cpu, (cpu, gpu)
    page = (ROOT / "docs" / "vertex.md").read_text()
    assert "\n### The trainer image\n" in page, "docs/vertex.md has no '### The trainer image' section"
    docs = re.split(r"^##+ ", page.split("\n### The trainer image\n", 1)[1], maxsplit=1, flags=re.M)[0]
    for figure in (cpu, gpu, gpu - cpu):
        assert megabytes(figure) in docs, f"docs/vertex.md#the-trainer-image should state {megabytes(figure)}"


if __name__ == "__main__":
    cpu, gpu = locked_wheel_bytes("trainer"), locked_wheel_bytes("trainer", "gpu")
    print(
        f"cpu {megabytes(cpu)} ({cpu} B), trainer {megabytes(gpu)} ({gpu} B), gpu group {megabytes(gpu - cpu)}"
    )
