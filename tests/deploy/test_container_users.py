"""Issue 11: start the services as the containers will see them (uid 10001, the image's directories,
Docker's fresh volumes, the kubelet's fsGroup pass over volumes and Secrets), as root with setpriv.

The failure cases are the reported bugs: a data directory the image did not create comes up root-owned
("not writable", exit 2), and the fsGroup pass makes the aggregator's keys 0660 (refused unless the
operator names the pod's fsGroup with DENIABLE_KEY_GROUP). Needs root and util-linux's setpriv (CI runs
as root); elsewhere each test says why it did not run.

Uid 10001 must be able to run this checkout's code wherever the checkout is: under a directory only
root may enter (root's home, ``mktemp -d``), or with an interpreter there (pyenv under /root), it
cannot. The session fixture ``runner`` then stages what it needs (the interpreter's prefix, the
environment's site-packages and this checkout's packages) as hard links (copies across file systems)
under a world-readable temporary directory, and skips with the reason if even that does not import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
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


_PYTHON: list[str] = [sys.executable]
"""How uid 10001 runs this checkout's Python (``env VAR=... python``); set by the fixture ``runner``."""


def deniable(*argv: str) -> list[str]:
    return [*_PYTHON, "-m", "deniable.cli", *argv]


def _fails_as_uid(argv: list[str]) -> str:
    """Empty if ``argv`` succeeds as uid 10001, else why not (the last line of its stderr)."""
    try:
        done = subprocess.run([*as_uid(), *argv], capture_output=True, text=True, timeout=120)
    except OSError as exc:
        return str(exc)
    return "" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["exit status"])[-1]


def _imports_as_uid(python: list[str]) -> str:
    """Empty if uid 10001 can import the services with ``python``, else why not."""
    return _fails_as_uid([*python, "-c", "import deniable.cli, deniable.aggregator, deniable.shuffler"])


def _link_tree(source: Path, target: Path, skip: tuple[str, ...] = ()) -> None:
    """Hard-link ``source``'s files under ``target`` (copy when linking fails), world-traversable dirs."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link, symlinks=True, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(*skip))  # fmt: skip
    for base, dirs, _ in os.walk(target):
        for name in dirs:
            Path(base, name).chmod(0o755)


def _stage(stage: Path) -> list[str]:
    """The interpreter, site-packages and this checkout's packages under ``stage``: the command to run."""
    checkout = Path(__file__).resolve().parents[2]
    mapping = tomllib.loads((checkout / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, directory in mapping.items():
        _link_tree(checkout / directory, stage / "src" / Path(*package.split(".")), ("__pycache__",))
    _link_tree(Path(sysconfig.get_paths()["purelib"]), stage / "site", ("__editable__*", "*.pth"))
    env = [f"PYTHONPATH={stage / 'src'}:{stage / 'site'}"]
    python = os.path.realpath(sys.executable)
    if _fails_as_uid([python, "-S", "-c", "pass"]):  # the interpreter itself is out of reach
        home, version = Path(sys.base_prefix), f"python{sys.version_info[0]}.{sys.version_info[1]}"
        _link_tree(
            home / "lib" / version, stage / "python" / "lib" / version, ("site-packages", "__pycache__")
        )
        for lib in (home / "lib").glob("libpython*.so*"):
            shutil.copy2(lib, stage / "python" / "lib" / lib.name)
        (stage / "python" / "bin").mkdir(parents=True)
        shutil.copy2(python, stage / "python" / "bin" / version)
        python = str(stage / "python" / "bin" / version)
        env.append(f"LD_LIBRARY_PATH={stage / 'python' / 'lib'}")
    return ["env", *env, python]


@pytest.fixture(scope="module", autouse=True)
def runner() -> Iterator[list[str]]:
    """How uid 10001 runs this checkout: directly when it can, else from a staged copy, else skip."""
    global _PYTHON
    if not (why := _imports_as_uid([sys.executable])):
        yield _PYTHON
        return
    stage = Path(tempfile.mkdtemp(prefix="deniable-uid-python-"))
    stage.chmod(0o755)
    try:
        _PYTHON = _stage(stage)
        if still := _imports_as_uid(_PYTHON):
            pytest.skip(f"uid {UID} cannot import this checkout ({why}), nor a staged copy: {still}")
        yield _PYTHON
    finally:
        _PYTHON = [sys.executable]
        shutil.rmtree(stage, ignore_errors=True)


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
