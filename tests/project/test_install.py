"""The layout the project is specified with: Hydra configs in conf/ at the top of the repository,
installed as the package mcsd.conf by a regular and by an editable install."""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from helpers import ROOT
import mcsd.conf
from helpers.runs import run_here

# Each command's config through its entry point (`--cfg job`: Hydra prints the composed config):
# (command, arguments, a line its config holds).
COMMANDS = [
    ("mcsd-train", ["--cfg", "job", "model=retnet", "size=tiny"], "_target_: mcsd.models.retnet.RetNetConfig"),
    ("mcsd-bench", ["--cfg", "job", "mode=train", "models=[retnet]"], "mode: train"),
    ("mcsd-eval", ["--cfg", "job", "tasks=local"], "tasks: local"),
    ("mcsd-probe", ["context", "--cfg", "job", "length=256"], "length: 256"),
]
# Run in the installed environment's Python: each command's entry point, its printed config.
RUN_COMMANDS = """
import contextlib, io, json, sys
from importlib.metadata import entry_points
import mcsd.conf
outputs = {"mcsd.conf": mcsd.conf.__file__}
for app, arguments, _ in json.loads(sys.argv[1]):
    (entry,) = entry_points(group="console_scripts", name=app)
    sys.argv = [app, *arguments]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        entry.load()()
    outputs[app] = printed.getvalue()
print(json.dumps(outputs))
"""


def test_conf_is_at_the_top_and_nowhere_else() -> None:
    assert (ROOT / "conf" / "train.yaml").is_file() and (ROOT / "conf" / "model" / "mcsd.yaml").is_file()
    assert not (ROOT / "mcsd" / "conf").exists()


@pytest.mark.slow
def test_a_regular_install_composes_every_command_outside_the_repository(tmp_path: Path) -> None:
    """A clean copy of the checkout (its tracked and new files) installed, not editable, into a
    fresh virtual environment (the dependencies read from this one's): from a folder outside
    the repository every command composes its config from the installed mcsd/conf/."""
    clone = tmp_path / "clone"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    for name in listed:
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    environment = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(environment)], check=True)
    python = environment / "bin" / "python"
    (packages,) = subprocess.run([str(python), "-c", "import site; print(*site.getsitepackages())"],
                                 capture_output=True, text=True, check=True).stdout.split()
    (Path(packages) / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                                "--no-build-isolation", "--no-index", str(clone)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-3000:]
    outside = tmp_path / "outside"
    outside.mkdir()
    result = subprocess.run([str(python), "-c", RUN_COMMANDS, json.dumps(COMMANDS)], cwd=outside, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs = json.loads(result.stdout.splitlines()[-1])
    assert Path(outputs["mcsd.conf"]).resolve() == (Path(packages) / "mcsd" / "conf" / "__init__.py").resolve()
    assert (Path(packages) / "mcsd" / "conf" / "experiment" / "mqar_converge.yaml").is_file()
    for app, _, line in COMMANDS:
        assert line in [text.strip() for text in outputs[app].splitlines()], (app, outputs[app][:2000])
    assert list(outside.iterdir()) == []  # --cfg job writes nothing


def test_the_editable_install_reads_conf_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This checkout's editable install: mcsd.conf is conf/, every command composes from a folder
    outside the repository, and a config file added under conf/ is seen without reinstalling."""
    assert Path(mcsd.conf.__file__).resolve() == ROOT / "conf" / "__init__.py"
    monkeypatch.chdir(tmp_path)
    for app, arguments, line in COMMANDS:
        result = run_here(app, *arguments)
        printed = [text.strip() for text in result.stdout.splitlines()]
        assert result.returncode == 0 and line in printed, (app, result.stderr[-2000:])
    added = ROOT / "conf" / f"added_by_test_{uuid.uuid4().hex}.yaml"
    try:
        added.write_text("defaults:\n  - train\n  - _self_\nseen: true\n")
        with initialize_config_module("mcsd.conf", version_base="1.3"):
            cfg = compose(added.stem, overrides=["model=retnet"])
        assert cfg.seen is True and cfg.model._target_ == "mcsd.models.retnet.RetNetConfig"
    finally:
        added.unlink()


# What the simulated GPU image lacks (besides the project): the dependencies that share Hydra's
# hydra_plugins/ namespace folder, hydra-core's sdist-only antlr4 runtime, and fla-core (the gpu
# extra, which the real image lacks too).
MISSING_ON_THE_IMAGE = ("hydra-core", "omegaconf", "antlr4-python3-runtime", "hydra-joblib-launcher",
                        "hydra-submitit-launcher", "fla-core")


@pytest.mark.slow
def test_the_gpu_check_installs_offline_from_a_wheel_folder(tmp_path: Path) -> None:
    """experiments/gpu_check: fill_wheels.py fills a folder for this Python, leaving out what an
    "image" has (every package of this environment but the project and Hydra's); in a fresh virtual
    environment holding only that image, run.sh installs the folder offline (two --target folders
    on PYTHONPATH, their bin/ on PATH) and runs every step: the installed project (not the
    checkout's) reports the device, the GPU tests are collected and skipped without a GPU, and
    the benchmarks refuse in one line that device=cuda has no GPU; every test module is collected.
    The image keeps this environment's torch: the GPU image's 2.11 is on the index only as its CUDA
    build (with its nvidia-* wheels, gigabytes), so no test may assume the local pin instead."""
    from importlib.metadata import distributions

    from packaging.utils import canonicalize_name

    probe = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest",
                            str(tmp_path / "probe"), "omegaconf==2.3.0"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"needs the package index (pip download failed: {probe.stderr.strip()[-300:]})")
    missing = {canonicalize_name(name) for name in (*MISSING_ON_THE_IMAGE, "mcsd")}
    have = tmp_path / "have.txt"
    have.write_text("\n".join(sorted({canonicalize_name(d.metadata["Name"]) for d in distributions()} - missing)) + "\n")
    wheels = tmp_path / "wheels"
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    filled = subprocess.run([sys.executable, str(ROOT / "experiments/gpu_check/fill_wheels.py"), str(wheels),
                             "--python-version", python_version, "--have", str(have)],
                            capture_output=True, text=True, timeout=600)
    assert filled.returncode == 0, filled.stderr[-3000:]
    fetched = {canonicalize_name(wheel.name.split("-")[0]) for wheel in wheels.glob("*.whl")}
    assert fetched == missing, fetched

    # The image: a fresh environment that sees this one's packages less the missing ones.
    image_packages = tmp_path / "image_packages"
    image_packages.mkdir()
    # Nor the notebook's test packages, which the GPU image lacks too (test modules that need them skip).
    prefixes = ("hydra", "omegaconf", "antlr4", "mcsd", "__editable__", "nbformat", "nbclient", "fla")
    for entry in Path(site.getsitepackages()[0]).iterdir():
        if not entry.name.startswith(prefixes) and "mcsd" not in entry.name:
            (image_packages / entry.name).symlink_to(entry)
    image = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", str(image)], check=True)
    python = image / "bin" / "python"
    (packages,) = subprocess.run([str(python), "-c", "import site; print(*site.getsitepackages())"],
                                 capture_output=True, text=True, check=True).stdout.split()
    (Path(packages) / "image.pth").write_text(f"{image_packages}\n")
    lacks = subprocess.run([str(python), "-c", "import omegaconf"], capture_output=True, text=True)
    assert lacks.returncode != 0 and "No module named 'omegaconf'" in lacks.stderr

    results, install_site = tmp_path / "results", tmp_path / "site"
    environment = {**os.environ, "PATH": f"{image / 'bin'}:{os.environ['PATH']}", "WHEELS": str(wheels),
                   "SITE": str(install_site), "PYTHONPATH": "", "VIRTUAL_ENV": str(image),
                   "PYTEST_OPTIONS": "--durations=3"}  # one process (no workers to start), its own durations
    run = subprocess.run(["bash", str(ROOT / "experiments/gpu_check/run.sh"), str(results)], env=environment,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]  # the benchmarks' refusal (exit 2)
    device = (results / "device.txt").read_text()
    assert "device: no CUDA device" in device
    assert f"mcsd from {install_site}/project/mcsd/__init__.py" in device
    assert (install_site / "project" / "bin" / "mcsd-bench").is_file()
    assert (install_site / "dependencies" / "fla" / "ops" / "hgrn").is_dir()  # the gpu extra: fla's kernels travel
    assert {path.name for path in (install_site / "dependencies" / "hydra_plugins").iterdir()} >= {
        "hydra_joblib_launcher", "hydra_submitit_launcher"}
    tests = (results / "pytest_gpu.txt").read_text()
    assert re.search(r"\b\d+ skipped\b", tests) and not re.search(r"\b(failed|error)", tests), tests[-2000:]
    assert "slowest 3 durations" in tests  # PYTEST_OPTIONS reached pytest (after run.sh's --durations=10)
    for mode in ("inference", "train"):
        log = (results / mode / "log.txt").read_text()
        assert "device=cuda but no GPU is visible: use device=cpu" in log and "Traceback" not in log, log[-2000:]
        assert not (results / mode / "results.csv").exists()
    # Sourced again with the same wheels (installed.sha256), install.sh only sets the paths.
    # In one install: the project's Hydra plugins (one target) and the launchers' (the other) are found
    # together; every test module imports in the image (what it lacks, a module skips for), as pytest -m gpu needs.
    installed = install_site / "project" / "mcsd" / "__init__.py"
    installed_at = installed.stat().st_mtime_ns
    composed = tmp_path / "composed.txt"
    # Hydra's own way of composing a folder of configs, in a Python that never imported mcsd: its plugin
    # scan imports hydra_plugins.mcsd_config_nodes, which stores the registry's options (ablation=, ...).
    (tmp_path / "compose.py").write_text(
        "from hydra import compose, initialize_config_dir\n"
        f"with initialize_config_dir({str(install_site / 'project' / 'mcsd' / 'conf')!r}, version_base='1.3'):\n"
        "    print(list(compose('train', overrides=['ablation=slope_only', 'size=tiny']).model.sections))\n")
    collected = subprocess.run(
        ["bash", "-c", f"source {ROOT / 'experiments/gpu_check/install.sh'} {wheels} {install_site} && cd {tmp_path} && "
         f"mcsd-train --cfg hydra hydra/sweeper=arms hydra/launcher=local_parallel model=retnet size=tiny > {composed} && "
         f"python3 -P compose.py >> {composed} && "
         f"cd {ROOT} && python3 -P -m pytest --collect-only -q -p no:cacheprovider -o addopts='' tests"],
        env=environment, capture_output=True, text=True, timeout=600)
    assert installed.stat().st_mtime_ns == installed_at  # the same wheels: the site as run.sh left it, not reinstalled
    assert "_target_: hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher" in composed.read_text()
    assert "_target_: hydra_plugins.mcsd_arms_sweeper.ArmsSweeper" in composed.read_text()
    assert composed.read_text().splitlines()[-1] == "['slope']"
    last = collected.stdout.strip().splitlines()[-1]
    assert collected.returncode == 0 and re.match(r"\d+ tests collected", last) and "error" not in last, \
        last + collected.stderr[-3000:]
