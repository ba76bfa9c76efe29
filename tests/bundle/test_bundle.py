"""The offline bundle (`./build_cluster.sh bundle`; docs/ml.md, "An offline
GPU check"), its install half tried on a clean Debian 13 machine without
network: a container of the Debian 13 minbase image (tests/site/site.sh
base: no Slurm, munge, Docker, procps or xz), on an internal network
(nothing outside reachable), unprivileged with every capability but
CAP_SYS_RESOURCE as tests/machines/ runs its machines, its own engine's
data on a volume, an init that reaps orphans as a machine's does. The bundle is built here once per session; the machine
gets it read-only, as a GPU machine gets it with the repository.

This machine has no GPU: the node gets one stand-in GPU (`--gpus
standin:1`, the scaffolding of tests/e2e/test_gpu.py), so the check runs
every step against a device file, and the CUDA program finds no driver.
Its "host" has an NVIDIA-style wrapper script /usr/bin/nvidia-smi that
execs the real program elsewhere, as the GPU machine of issue 43 had.
Run by tests/run.sh (stage 6b)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
OUT = Path(os.environ.get("DELEGATE_STATE_DIR", "/var/lib/delegate")) / "bundle-test"
BUNDLE = OUT / "delegate-offline.tar"
BASE = "delegate-site-base:trixie"
NET = "delegate-bundle"
MACHINE = "bundle-gpubox"
BARE = "bundle-bare"
# A wrapper as the GPU machine had, and the "real" program it runs
# (a copy of `true`: there is no driver here).
WRAPPER = '#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi "$@"\n'
# tests/bundle/gpu-machine.sh as the machine sees it.
GPU_MACHINE = "/repo-tests/gpu-machine.sh"
VENV = "/opt/torch/.venv"
DRIVER_LIBS = "/usr/local/nvidia/lib64"


def sh(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def on(name: str, cmd: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return sh("docker", "exec", name, "bash", "-c", cmd, timeout=timeout)


def start(name: str, network: str) -> None:
    sh("docker", "rm", "-f", name)
    sh("docker", "volume", "rm", f"{name}-docker")
    r = sh(
        "docker", "run", "-d", "--init", "--name", name, "--hostname", "gpubox", "--network", network,
        "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
        "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
        "--security-opt", "systempaths=unconfined", "--device-cgroup-rule", "a *:* rwm",
        "--tmpfs", "/run", "--tmpfs", "/tmp", "-v", f"{name}-docker:/var/lib/docker",
        "-v", f"{OUT}:/bundle:ro", "-v", f"{REPO / 'tests/bundle'}:/repo-tests:ro", BASE, "sleep", "infinity",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    # What the machine's boot would have done: its cgroup hierarchies
    # writable (a container gets them read-only), the bundle unpacked.
    boot = (
        "for m in $(awk '$2 ~ /^\\/sys\\/fs\\/cgroup\\// { print $2 }' /proc/mounts); do "
        "mount -o remount,bind,rw $m; done; mount -o remount,rw /sys; "
        "cd /root && tar -xf /bundle/delegate-offline.tar"
    )
    r = on(name, boot)
    assert r.returncode == 0, r.stderr


def stop(name: str) -> None:
    sh("docker", "rm", "-f", name)
    sh("docker", "volume", "rm", f"{name}-docker")


@pytest.fixture(scope="module")
def bundle():
    r = sh(str(REPO / "build_cluster.sh"), "bundle", "--out", str(BUNDLE), timeout=1800)
    assert r.returncode == 0, f"build_cluster.sh bundle failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    r = sh(str(REPO / "tests/site/site.sh"), "base", timeout=1800)
    assert r.returncode == 0, f"the Debian 13 base image: {r.stdout[-2000:]}{r.stderr[-2000:]}"
    return BUNDLE


@pytest.fixture(scope="module")
def machine(bundle):
    # A driver library the system's loader does not know, named only by
    # root's LD_LIBRARY_PATH, as on the GPU machine (a copy of zlib under
    # the management library's name: nothing calls into it here).
    fake = OUT / "libnvidia-ml.so.1"
    r = sh("cp", "/usr/lib/x86_64-linux-gnu/libz.so.1", str(fake))
    assert r.returncode == 0, r.stderr
    r = sh("patchelf", "--set-soname", fake.name, str(fake))
    assert r.returncode == 0, r.stderr
    sh("docker", "network", "create", "--internal", NET)
    start(MACHINE, NET)
    r = on(
        MACHINE,
        f"install -d /usr/local/nvidia/bin {DRIVER_LIBS} && cp /usr/bin/true /usr/local/nvidia/bin/nvidia-smi "
        f"&& printf '%s' '{WRAPPER}' >/usr/bin/nvidia-smi && chmod 0755 /usr/bin/nvidia-smi "
        f"&& cp /bundle/{fake.name} {DRIVER_LIBS}/",
    )
    assert r.returncode == 0, r.stderr
    # The very command a lent GPU machine runs (docs/ml.md, "Tried on a real
    # GPU"), with the stand-in for the GPU. Its python3 is a virtual
    # environment's, first in root's PATH, as the GPU machine's PyTorch one.
    r = on(
        MACHINE,
        f"python3 -m venv --without-pip {VENV} && PATH={VENV}/bin:$PATH LD_LIBRARY_PATH={DRIVER_LIBS} "
        f"{GPU_MACHINE} /bundle/delegate-offline.tar /root/out --gpus standin:1",
        timeout=900,
    )
    log = on(MACHINE, "cat /root/out/facts.txt /root/out/offline.log").stdout
    yield MACHINE, subprocess.CompletedProcess(r.args, r.returncode, log, r.stdout + r.stderr)
    if os.environ.get("DELEGATE_BUNDLE_KEEP") != "1":
        stop(MACHINE)
        sh("docker", "network", "rm", NET)


def test_the_bundle_fits_a_gpu_machines_transfer(bundle):
    mib = bundle.stat().st_size / 2**20
    assert mib < 58, f"{mib:.1f} MiB"
    names = sh("tar", "-tf", str(bundle)).stdout.split()
    assert sorted(names) == [
        "delegate-offline/",
        "delegate-offline/MANIFEST",
        "delegate-offline/install.sh",
        "delegate-offline/payload.tar.xz",
    ]


def test_install_and_check_pass_on_a_bare_debian_13_without_network(machine):
    name, r = machine
    out = r.stdout  # the machine's facts and the one log
    assert r.returncode == 0, (out + r.stderr)[-6000:]
    for step in ("1. machine:", "2. unpacked into /opt/delegate-offline", "3. delegate's packages:",
                 "4. cluster: gpubox idle gpu:1", "5. image delegate-sandbox:host"):  # fmt: skip
        assert step in out, f"{step!r} missing:\n{out[-6000:]}"
    passed = re.findall(r"^PASS (\d)\. ", out, re.M)
    assert passed == ["1", "2", "3", "4", "5", "6", "7"], out[-6000:]
    assert "=== GPU check: all passed" in out
    # The one log holds the install and the check, the machine's facts and
    # the daemons' logs are beside it.
    log = on(name, "cat /root/out/offline.log").stdout
    assert "=== delegate offline install" in log and "=== GPU check: all passed" in log
    files = on(name, "cat /root/out/facts.txt; tar -tzf /root/out/logs.tar.gz").stdout
    assert "cgroup: " in files and "etc/slurm/cgroup.conf" in files, files
    # The Python call's fingerprint names the GPU Slurm gave it.
    assert "fingerprint gpu: {" in log and "'device': '/dev/delegate-gpu0'" in log


def test_the_image_takes_the_real_nvidia_smi_behind_the_wrapper(machine):
    name, r = machine
    assert "nvidia-smi: /usr/local/nvidia/bin/nvidia-smi (behind /usr/bin/nvidia-smi)" in r.stdout
    code = "import os; print(os.readlink('/usr/bin/nvidia-smi'), open('/usr/bin/nvidia-smi', 'rb').read(4))"
    ls = sh("docker", "exec", name, "docker", "run", "--rm", "--network", "none", "delegate-sandbox:host",
            "python3", "-c", code)  # fmt: skip
    assert ls.returncode == 0, ls.stderr
    assert ls.stdout.strip() == "/usr/local/nvidia/bin/nvidia-smi b'\\x7fELF'", ls.stdout


def test_the_drivers_libraries_on_ld_library_path_reach_the_loader_and_the_image(machine):
    name, r = machine
    assert f"driver libraries: {DRIVER_LIBS} added to the loader's paths" in r.stdout, r.stdout[-4000:]
    assert "libnvidia-ml.so.1" in on(name, "ldconfig -p").stdout
    code = "import ctypes; ctypes.CDLL('libnvidia-ml.so.1'); print('loaded')"
    found = sh("docker", "exec", name, "docker", "run", "--rm", "--network", "none", "delegate-sandbox:host",
               "python3", "-c", code)  # fmt: skip
    assert found.stdout.strip() == "loaded", found.stdout + found.stderr


def test_nothing_of_the_hosts_lib_is_replaced_and_slurm_finds_the_bundles(machine):
    name, _ = machine
    r = on(
        name,
        "ls /usr/lib/x86_64-linux-gnu/libmunge* /usr/lib/x86_64-linux-gnu/libhwloc* 2>&1; "
        "ldd /opt/delegate-offline/sbin/slurmd | grep -c /opt/delegate-offline/lib",
    )
    assert "No such file" in r.stdout, r.stdout
    assert int(r.stdout.split()[-1]) >= 2, r.stdout


def test_the_student_is_locked_down_as_on_any_node(machine):
    name, _ = machine
    student = "runuser -u delegate-student -- "
    r = on(name, student + "sbatch --wrap true")
    assert r.returncode != 0 and "delegate" in (r.stdout + r.stderr).lower(), r.stdout + r.stderr
    r = on(name, student + "docker ps")
    assert r.returncode != 0 and "permission denied" in (r.stdout + r.stderr).lower(), r.stdout + r.stderr


def test_a_second_run_keeps_the_unpacked_bundle_and_passes_again(machine):
    name, _ = machine
    r = on(name, "/root/delegate-offline/install.sh --gpus standin:1 --check", timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "2. /opt/delegate-offline holds this bundle already" in r.stdout
    assert "=== GPU check: all passed" in r.stdout


def test_a_machine_with_only_loopback_is_told_what_to_add(bundle):
    start(BARE, "none")
    try:
        r = on(BARE, "/root/delegate-offline/install.sh --gpus none")
    finally:
        stop(BARE)
    out = r.stdout + r.stderr  # the install's output goes to its log and stdout
    assert r.returncode != 0
    assert "no network address but loopback" in out and "ip link add delegate0 type dummy" in out, out
