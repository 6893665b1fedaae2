# The trainer image: `python -m trainer.task` on Vertex AI GPU worker pools (CustomJob and the
# tuning job's trials), and `python -m trainer.prepare` / `trainer.evaluate` when the pipeline
# replaces the command. Its stages, each built by naming it (the pipeline's build step does):
#   base              Python, the lock's `trainer` group, the entry point: no code, built by none
#   cpu               base plus trainer/: no CUDA libraries. The preparation and evaluation jobs
#                     (one CPU replica each) run it, and the dataflow stage is built on it
#   trainer           base plus the `gpu` group (TensorFlow's CUDA wheels) and trainer/: the
#                     training job and the tuning trials
#   reduction-server  the trainer plus Google's NCCL plugin, for a training job with Reduction
#                     Server replicas (reduction_server_count > 0) alone
#   dataflow          cpu plus Apache Beam, the Dataflow Flex Template launcher and Beam's
#                     worker boot: a Beam preparation on Dataflow (prepare_engine=beam) alone
# cpu and trainer share base's layers (a registry stores and a machine pulls them once); what the
# gpu group adds, in compressed wheel bytes, is in docs/vertex.md#the-trainer-image.
#
# Build context (see .dockerignore): this file, trainer/, pyproject.toml and uv.lock, nothing else.
#   docker build --target trainer -t trainer .
#   docker run --rm trainer --help                  # trainer.task's flags
#   docker run --rm --entrypoint python trainer -m trainer.prepare --help
#   docker run --rm --gpus all --entrypoint python trainer -m trainer.gpucheck   # the GPUs it sees

# uv, only to turn uv.lock into an install: the version cloudbuild.yaml and ci.yml use too
# (tests/ci check they agree). Its digest, like the base's below, is still to be filled in.
FROM ghcr.io/astral-sh/uv:0.13.8 AS uv

# Plain Python, of the lock's version (requires-python in pyproject.toml; tests/ci check it):
# TensorFlow and every CUDA library it loads come from uv.lock, not from the base. TF 2.21's
# Linux wheel is built for CUDA 12.5 and cuDNN 9 and finds them through the RUNPATHs of its own
# shared libraries, `$ORIGIN/../nvidia/<library>/lib`: the nvidia-* wheels of its `and-cuda`
# extra, locked in the `gpu` dependency group (pyproject.toml; tests/ci/test_cuda_lock.py checks
# that the lock provides every library those RUNPATHs name). A TensorFlow `-gpu` base image
# without those wheels has been reported to register no GPU at all (tensorflow/tensorflow#94593,
# #62412), which would train on the CPUs of paid GPU machines; trainer.task refuses to start then.
# TODO(pin): append the digest once it can be read from the registry; it is deliberately not
# written from memory:  docker buildx imagetools inspect python:3.11-slim-bookworm
FROM python:3.11-slim-bookworm AS base

# The NVIDIA driver is the host's: Vertex's GPU machines mount it into the container, as GKE's
# device plugin does, under /usr/local/nvidia (lib64, bin; GoogleCloudPlatform/
# container-engine-accelerators, the `-container-path` of its nvidia_gpu plugin), or the NVIDIA
# container runtime does into the system library folders, which the loader searches anyway.
# LD_LIBRARY_PATH names only the driver's folders (libcuda.so.1, libnvidia-ml.so.1): the CUDA
# toolkit's libraries stay those of the lock, found through TF's RUNPATHs. NVIDIA_* ask the NVIDIA
# container runtime (`docker run --gpus`) for the compute libraries and nvidia-smi, as NVIDIA's
# own CUDA images do. Which of the two mounts Vertex uses, and its driver version, only a run on
# Vertex shows: `make gpu-check` prints both.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    TF_USE_LEGACY_KERAS=1 \
    UV_PYTHON_DOWNLOADS=never \
    UV_NO_CACHE=1 \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib \
    PATH=/usr/local/nvidia/bin:/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

COPY --from=uv /uv /usr/local/bin/uv

# Pipes in RUN fail the build when any command in them fails, not only the last.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

WORKDIR /app

# Dependencies first, so that editing trainer/ does not reinstall them.
# - The `trainer` dependency group exactly as locked, hashes included (uv export --frozen never
#   re-resolves), into the base's own interpreter (the image is this application's alone).
# - --compile-bytecode: every module compiled once, here. PYTHONDONTWRITEBYTECODE=1 (above) stops
#   a process writing .pyc, so without it every replica compiles what it imports from source at
#   each start (`import tensorflow`: 17.5 s, 7.3 s compiled, on the 2-CPU machine this is built
#   on); the .pyc of TensorFlow, tf_keras, Keras and numpy take about 85 MB.
# - The import check fails the build, not the first job, if the group does not import. TF's
#   Linux wheel is the same with or without the gpu group; without its nvidia-* wheels it runs
#   on the CPU alone, which is all the jobs on this stage (and cpu) ask of it.
COPY pyproject.toml uv.lock /app/
RUN uv export --quiet --frozen --only-group trainer --no-emit-project --output-file /tmp/requirements.txt \
    && uv pip install --system --require-hashes --compile-bytecode -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt \
    && TF_CPP_MIN_LOG_LEVEL=2 python -c "import tensorflow as tf, tf_keras, tensorflow_datasets, hypertune, importlib_resources; print('tensorflow', tf.__version__, 'tf_keras', tf_keras.__version__)"

# Root, on purpose. A tuning trial reports its metric with cloudml-hypertune into the file named
# by $CLOUD_ML_HP_METRIC_FILE, which Vertex AI sets and reads. cloudml-hypertune's own default has
# been /tmp/hypertune/ since 0.1.0.dev4 (2018), yet users of AI Platform and Vertex AI report the
# platform's path to be under /var/hypertune/ and writable by root only, non-root images reporting
# nothing (GoogleCloudPlatform/cloudml-hypertune#6, open since 2021, no maintainer answer). So
# Vertex runs the image's USER, but no source says whether it mounts that folder over the image's:
# a folder pre-created here for an unprivileged user may well be hidden at run time, and every
# trial would end INFEASIBLE. To try an unprivileged USER again (with that folder created here and
# handed to it), run a one-trial tuning job: trainer.task checks the file at start and, in a
# trial, stops within a second naming the path, the uid and the folder's owner.
# hadolint ignore=DL3002
USER 0:0

# Vertex's containerSpec.command replaces the entry point (the pipeline runs trainer.prepare so);
# containerSpec.args become trainer.task's flags.
ENTRYPOINT ["python", "-m", "trainer.task"]

# The CPU jobs' image: no CUDA libraries (docs/vertex.md#the-trainer-image says how much less).
FROM base AS cpu
COPY trainer/ /app/trainer/

# The GPU jobs' image: the `trainer` and `gpu` groups as locked, installed over base's, which
# adds the gpu group's nvidia-* wheels alone (uv keeps what is installed at the locked version).
# The check fails the build, not the first GPU job, if TF was not built for CUDA; it prints the
# CUDA and cuDNN versions TF was built for.
FROM base AS trainer
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN uv export --quiet --frozen --only-group trainer --only-group gpu --no-emit-project --output-file /tmp/requirements.txt \
    && uv pip install --system --require-hashes --compile-bytecode -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt \
    && TF_CPP_MIN_LOG_LEVEL=2 python -c "import tensorflow as tf; info = tf.sysconfig.get_build_info(); assert info['is_cuda_build'], info; print('tensorflow', tf.__version__, 'CUDA', info['cuda_version'], 'cuDNN', info['cudnn_version'])"
COPY trainer/ /app/trainer/

# Reduction Server (docs/architecture.md#reduction-server): for a job with a Reduction Server pool
# (worker pool 2) to use its reducers, the chief's and the workers' image needs Google's NCCL
# transport plugin. Vertex AI's "Distributed training" page, Reduction Server prerequisites: "A
# custom container with NCCL 2.7 or later and the `google-reduction-server` package installed",
# from the apt repository `google-fast-socket` at packages.cloud.google.com, signed by the key at
# packages.cloud.google.com/apt/doc/apt-key.gpg:
# https://cloud.google.com/vertex-ai/docs/training/distributed-training#reduce_training_time_with_reduction_server
# Same repository, key and package as Google's line; only the key goes to a keyring that this
# one repository is signed-by, not through Google's `apt-key add` (deprecated, and gone from
# newer apt). NCCL itself is the lock's (nvidia-nccl-cu12, 2.27): TensorFlow loads it, and it
# loads the plugin. A stage of its own, so that this unpinned package from a repository the
# project cannot read is in the image of a job that asked for reducers, and in no other.
# The last command fails the build if the package brought no shared library.
# TODO(pin): Google names no version, and the repository cannot be read from where this project
# is built; after a build, read it with
#   docker run --rm --entrypoint dpkg-query trainer-reduction-server -W google-reduction-server
# then install google-reduction-server=<that version> here (and drop DL3008 below).
FROM trainer AS reduction-server
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl gnupg \
    && curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg \
        | gpg --batch --yes --dearmor -o /usr/share/keyrings/google-fast-socket.gpg \
    && echo "deb [signed-by=/usr/share/keyrings/google-fast-socket.gpg] https://packages.cloud.google.com/apt google-fast-socket main" \
        > /etc/apt/sources.list.d/google-fast-socket.list \
    && apt-get update \
    && apt-get install -y --no-install-recommends google-reduction-server \
    && rm -rf /var/lib/apt/lists/* \
    && dpkg -L google-reduction-server | grep '\.so'

# Dataflow (docs/training.md#preparing-on-apache-beam): the image of a Beam preparation on
# Dataflow (`prepare_engine=beam` on Vertex), both as the Flex Template's launcher and as the
# workers' SDK container, so that the job installs nothing at run time. On the cpu stage
# (Dataflow's workers have no GPU here); its own stage, so that no other image carries Beam:
# - the lock's `beam` group (apache-beam[gcp], the version the local DirectRunner runs);
# - Beam's worker boot program, from Beam's SDK image of the same Beam and Python versions: a
#   custom SDK container's entrypoint must be /opt/apache/beam/boot (Dataflow, "Build custom
#   container images": https://cloud.google.com/dataflow/docs/guides/build-container-image);
# - Google's Flex Template launcher, which runs FLEX_TEMPLATE_PYTHON_PY_FILE with the template's
#   parameters as flags ("Configure Flex Templates", Dockerfile environment variables:
#   https://cloud.google.com/dataflow/docs/guides/templates/configuring-flex-templates). The tag
#   is the one Google's sample python-docs-samples dataflow/flex-templates/pipeline_with_dependencies
#   copies it from; one image for launcher and workers, as that sample does.
# TODO(pin): append both images' digests once they can be read from the registry.
# TODO(pin): move the launcher off 20230622_RC00 (2023; still the tag Google's sample copies) to
# the reviewed release: the tag marked "(latest)" in the Python table of
# https://cloud.google.com/dataflow/docs/reference/flex-templates-base-images ("images released at
# later dates are not yet reviewed"). Only that page's Java table could be read from here
# (20260122_RC00), and a Python tag is not written from a guess.
FROM apache/beam_python3.11_sdk:2.77.0 AS beam-sdk
FROM gcr.io/dataflow-templates-base/python311-template-launcher-base:20230622_RC00 AS flex-launcher

FROM cpu AS dataflow
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN uv export --quiet --frozen --only-group beam --no-emit-project --output-file /tmp/requirements.txt \
    && uv pip install --system --require-hashes --compile-bytecode -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt \
    && python -c "import apache_beam; print('apache-beam', apache_beam.__version__)"
COPY --from=beam-sdk /opt/apache/beam /opt/apache/beam
COPY --from=flex-launcher /opt/google/dataflow/python_template_launcher /opt/google/dataflow/python_template_launcher
# The launcher runs a file, not a module: this one runs `python -m trainer.prepare` (a file inside
# trainer/ would put trainer/ first on sys.path, where its modules would shadow others' names).
RUN printf 'import runpy\nrunpy.run_module("trainer.prepare", run_name="__main__", alter_sys=True)\n' > /app/dataflow_main.py
ENV FLEX_TEMPLATE_PYTHON_PY_FILE=/app/dataflow_main.py
ENTRYPOINT ["/opt/apache/beam/boot"]
