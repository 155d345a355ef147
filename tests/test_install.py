"""The layout the project is specified with: Hydra configs in conf/ at the top of the repository,
installed as the package mcsd.conf by a regular and by an editable install."""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

import mcsd.conf
from harness import run_here

ROOT = Path(__file__).resolve().parent.parent
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
