"""Issue 11: start the services as the containers will see them (uid 10001, the image's directories,
Docker's fresh volumes, the kubelet's fsGroup pass over volumes and Secrets), as root with setpriv.

The failure cases are the reported bugs: a data directory the image did not create comes up root-owned
("not writable", exit 2), and the fsGroup pass makes the aggregator's keys 0660 (refused unless the
operator names the pod's fsGroup with DENIABLE_KEY_GROUP). Needs root and util-linux's setpriv (CI runs
as root); elsewhere each test says why it did not run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from support.processes import free_port

UID = 10001
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="simulating container users needs root and setpriv (CI runs as root)",
)


def as_uid(*groups: int) -> list[str]:
    """setpriv prefix: uid/gid 10001 and exactly these supplementary groups (fsGroup, as the runtime adds)."""
    extra = ["--groups", ",".join(map(str, groups))] if groups else ["--clear-groups"]
    return ["setpriv", "--reuid", str(UID), "--regid", str(UID), *extra]


def deniable(*argv: str) -> list[str]:
    return [sys.executable, "-m", "deniable.cli", *argv]


@pytest.fixture
def root(dp: ModuleType) -> Iterator[Path]:
    """A world-traversable scratch root (pytest's tmp_path is 0700 root) with deploy/dev-setup.sh's
    certificates and secrets in it, owned as that script leaves them."""
    path = Path(tempfile.mkdtemp(prefix="deniable-uid-"))
    path.chmod(0o755)
    env = {**os.environ, "DENIABLE": str(Path(sys.executable).with_name("deniable"))}
    subprocess.run([str(dp.DEPLOY / "dev-setup.sh"), str(path)], check=True, env=env, capture_output=True)
    yield path
    shutil.rmtree(path)


def image_data_dir(root: Path, name: str) -> Path:
    """What the Dockerfile's RUN line makes (Docker copies it into a fresh named volume)."""
    path = root / "var-lib-deniable" / name
    path.mkdir(parents=True)
    for p in (path.parent, path):
        os.chown(p, UID, UID)
    path.chmod(0o750)
    return path


def kubelet_fsgroup_pass(volume: Path, fs_group: int = UID) -> None:
    """The kubelet's SetVolumeOwnership: group fsGroup everywhere, g+rw on files, g+rwxs on dirs."""
    for base, dirs, files in os.walk(volume):
        for name in dirs:
            os.chown(Path(base, name), -1, fs_group)
            Path(base, name).chmod(Path(base, name).stat().st_mode & 0o7777 | 0o2070)
        for name in files:
            os.chown(Path(base, name), -1, fs_group)
            Path(base, name).chmod(Path(base, name).stat().st_mode & 0o777 | 0o060)
    os.chown(volume, -1, fs_group)
    volume.chmod(volume.stat().st_mode & 0o7777 | 0o2070)


def secret_volume(root: Path, files: dict[str, Path], fs_group: int = UID, mode: int = 0o440) -> Path:
    """A Secret mounted with defaultMode ``mode``: files owned by root, group fsGroup."""
    path = root / f"secret-{len(list(root.iterdir()))}"
    path.mkdir()
    path.chmod(0o755)
    for name, source in files.items():
        shutil.copyfile(source, path / name)
        os.chown(path / name, 0, fs_group)
        (path / name).chmod(mode)
    return path


def aggregator_argv(data_dir: Path, tls: Path, port: int) -> list[str]:
    return deniable(
        "aggregator", "serve", f"--listen=127.0.0.1:{port}", f"--data-dir={data_dir}", "--decrypt-workers=0",
        f"--tls-cert={tls}/aggregator.pem", f"--tls-key={tls}/aggregator.key",
        f"--tls-ca={tls}/aggregator-clients-ca.pem",
    )  # fmt: skip


def healthy(prefix: list[str], argv: list[str], deadline_s: float = 60.0) -> str:
    """Poll `deniable health` (as the HEALTHCHECK does, under ``prefix``) until SERVING or the deadline."""
    end = time.monotonic() + deadline_s
    status = ""
    while time.monotonic() < end:
        done = subprocess.run([*prefix, *deniable("health", *argv)], capture_output=True, text=True)
        status = (done.stdout + done.stderr).strip()
        if done.returncode == 0:
            return status
        time.sleep(0.3)
    return status


def stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    try:
        return proc.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[1]


def test_a_volume_the_image_did_not_create_is_not_writable(root: Path) -> None:
    """The reported bug: a root-owned mount point; uid 10001 exits 2 with a one-line reason."""
    volume = root / "root-owned"
    volume.mkdir(mode=0o755)
    tls = root / "certs" / "aggregator"
    done = subprocess.run(
        [*as_uid(), *aggregator_argv(volume / "aggregator", tls, free_port())], capture_output=True, text=True
    )
    assert done.returncode == 2 and "is not writable" in done.stderr


def test_services_start_as_10001_on_the_image_layout_with_dev_setup_certificates(root: Path) -> None:
    """Compose: image-owned data dirs, dev-setup.sh's files bind-mounted; both services report SERVING."""
    agg_port, shuf_port = free_port(), free_port()
    agg_tls, shuf_tls = root / "certs" / "aggregator", root / "certs" / "shuffler"
    env = {**os.environ, "DENIABLE_MQTT_PASSWORD_FILE": str(root / "secrets" / "shuffler_mqtt_password")}
    aggregator = subprocess.Popen(
        [*as_uid(), *aggregator_argv(image_data_dir(root, "aggregator"), agg_tls, agg_port)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    shuffler = None
    try:
        check = [f"--address=127.0.0.1:{agg_port}", f"--tls-ca={agg_tls}/aggregator-ca.pem",
                 f"--tls-cert={agg_tls}/aggregator.pem", f"--tls-key={agg_tls}/aggregator.key"]  # fmt: skip
        assert healthy(as_uid(), check) == "SERVING"
        shuffler = subprocess.Popen(
            [*as_uid(), *deniable(
                "shuffler", "serve", f"--listen=127.0.0.1:{shuf_port}",
                f"--data-dir={image_data_dir(root, 'shuffler')}", f"--upstream=127.0.0.1:{agg_port}",
                f"--operator-listen=127.0.0.1:{free_port()}", f"--tls-cert={shuf_tls}/shuffler.pem",
                f"--tls-key={shuf_tls}/shuffler.key", f"--tls-ca={shuf_tls}/shuffler-clients-ca.pem",
                f"--upstream-ca={shuf_tls}/aggregator-ca.pem",
            )],
            stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert (
            healthy(as_uid(), [f"--address=127.0.0.1:{shuf_port}", f"--tls-ca={shuf_tls}/shuffler-ca.pem"])
            == "SERVING"
        )
    finally:
        if shuffler is not None:
            stop(shuffler)
        stop(aggregator)


def test_kubelet_fsgroup_modes_need_the_named_key_group(root: Path) -> None:
    """Kubernetes: PVC and Secrets after the fsGroup pass. Keys become 0660 group 10001: refused by
    default (as before), accepted with DENIABLE_KEY_GROUP=10001, refused again once world-readable."""
    volume = root / "pvc"
    volume.mkdir()
    kubelet_fsgroup_pass(volume)  # first mount: empty volume, root-owned, group fsGroup
    certs = root / "certs" / "aggregator"
    files = ("aggregator.pem", "aggregator.key", "aggregator-clients-ca.pem", "aggregator-ca.pem")
    tls = secret_volume(root, {n: certs / n for n in files})
    port = free_port()
    check = [f"--address=127.0.0.1:{port}", f"--tls-ca={tls}/aggregator-ca.pem",
             f"--tls-cert={tls}/aggregator.pem", f"--tls-key={tls}/aggregator.key"]  # fmt: skip
    pod = as_uid(UID)  # the runtime adds fsGroup to the process's groups
    env = {**os.environ, "DENIABLE_KEY_GROUP": str(UID)}

    first = subprocess.Popen(
        [*pod, *aggregator_argv(volume, tls, port)], stderr=subprocess.PIPE, text=True, env=env
    )
    assert healthy(pod, check) == "SERVING", stop(first)
    stop(first)
    key = volume / "keys" / "1.key"
    assert key.stat().st_mode & 0o777 == 0o600

    kubelet_fsgroup_pass(volume)  # rescheduled: the pass runs again (fsGroupChangePolicy: Always)
    assert key.stat().st_mode & 0o777 == 0o660 and key.stat().st_gid == UID
    refused = subprocess.run([*pod, *aggregator_argv(volume, tls, port)], capture_output=True, text=True)
    assert refused.returncode == 2 and "accessible to others in its group" in refused.stderr

    again = subprocess.Popen(
        [*pod, *aggregator_argv(volume, tls, port)], stderr=subprocess.PIPE, text=True, env=env
    )
    assert healthy(pod, check) == "SERVING", stop(again)
    stop(again)

    key.chmod(0o664)
    wide = subprocess.run(
        [*pod, *aggregator_argv(volume, tls, port)], capture_output=True, text=True, env=env
    )
    assert wide.returncode == 2 and "accessible to others (mode 0o664)" in wide.stderr
