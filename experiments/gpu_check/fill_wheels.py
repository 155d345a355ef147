"""Fill a folder with the wheels an offline GPU machine needs to run the project.

    python experiments/gpu_check/fill_wheels.py .whl                       # Python 3.12, Linux x86_64
    python experiments/gpu_check/fill_wheels.py .whl --python-version 3.11 --have their_pip_freeze.txt

Run it on a machine with a package index (a checkout of the project with its build
dependency, setuptools). It builds the project's own wheel, then walks its dependencies with
its ``--extras`` (``gpu`` by default: flash-linear-attention's kernels, fla-core and einops; and theirs) and fetches a wheel of each one the GPU machine does not have (``--have``: one package
a line, ``name`` or ``name==version``, as ``pip freeze`` writes; by default
``gpu_image_packages.txt`` beside this file, the packages of this workplace's GPU image), each
for the given Python version and platform, within the versions the requirement allows. A package
with no wheel for that platform is built into one here when it is pure Python (antlr4's runtime,
which hydra-core needs, is published as an sdist alone). One version of each package: the
first requirement met decides. What the machine has is left as it is (its torch too, whatever
its version: the project runs on the GPU image's torch as on the one pinned here).

``experiments/gpu_check/install.sh`` installs the folder on the GPU machine.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_HAVE = HERE / "gpu_image_packages.txt"
PLATFORM_TAGS = ["linux_{arch}", "manylinux1_{arch}", "manylinux2010_{arch}", "manylinux2014_{arch}",
                 *(f"manylinux_2_{minor}_{{arch}}" for minor in range(5, 40))]


def read_have(path: Path) -> set[str]:
    """The canonical names of a ``pip freeze``-style list (comments and blank lines skipped)."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(canonicalize_name(line.split("==")[0].split(" @ ")[0].strip()))
    return names


def wheel_requirements(wheel: Path) -> tuple[str, list[Requirement]]:
    """A wheel's canonical name and its ``Requires-Dist`` lines."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(archive.read(metadata).decode())
    return canonicalize_name(message["Name"]), [Requirement(line) for line in message.get_all("Requires-Dist") or []]


def marker_environment(python_version: str, arch: str, extra: str) -> dict[str, str]:
    return {"python_version": python_version, "python_full_version": f"{python_version}.0", "os_name": "posix",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": arch,
            "platform_python_implementation": "CPython", "implementation_name": "cpython", "extra": extra}


def needed(requirement: Requirement, extras: set[str], python_version: str, arch: str) -> bool:
    """Whether a ``Requires-Dist`` line applies on the target (its marker, for each requested extra)."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate(marker_environment(python_version, arch, extra)) for extra in {"", *extras})


def new_wheel(folder: Path, before: set[Path]) -> Path:
    (wheel,) = set(folder.glob("*.whl")) - before
    return wheel


def fetch(requirement: Requirement, folder: Path, python_version: str, arch: str) -> Path:
    """A wheel of ``requirement`` (its version range, no extras) for the target: downloaded, or
    built here from an sdist when the package is pure Python."""
    spec = f"{requirement.name}{requirement.specifier}"
    before = set(folder.glob("*.whl"))
    platforms = [option for tag in PLATFORM_TAGS for option in ("--platform", tag.format(arch=arch))]
    downloaded = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                                 "--python-version", python_version, "--implementation", "cp", *platforms,
                                 "--dest", str(folder), spec], capture_output=True, text=True)
    if downloaded.returncode == 0:
        return new_wheel(folder, before)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(folder),
                            spec], capture_output=True, text=True)
    if built.returncode != 0:
        raise SystemExit(f"{spec}: no wheel for Python {python_version} on {arch} and none could be built here:\n"
                         f"{downloaded.stderr.strip()[-1500:]}\n{built.stderr.strip()[-1500:]}")
    wheel = new_wheel(folder, before)
    if not wheel.name.endswith("-none-any.whl"):
        wheel.unlink()
        raise SystemExit(f"{spec}: no wheel for Python {python_version} on {arch}, and the one built here "
                         f"({wheel.name}) is for this machine: build it on the target")
    return wheel


PACKAGED = ("mcsd", "conf", "hydra_plugins", "setup.py", "pyproject.toml", "README.md")  # what the wheel is built from
CARRY_LIMIT_MIB = 64  # what the device tool carries to the GPU machine: the working tree and the wheels


def build_project(folder: Path) -> Path:
    """The project's own wheel, built from a temporary copy of what it packages (a build in the
    checkout would leave build/ and mcsd.egg-info there, which would travel with it)."""
    before = set(folder.glob("*.whl"))
    with tempfile.TemporaryDirectory() as copy:
        for name in PACKAGED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, Path(copy) / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif source.is_file():
                shutil.copy2(source, Path(copy) / name)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "--wheel-dir", str(folder.absolute()), copy], check=True)
    return new_wheel(folder, before)


def travelling_mib(folder: Path) -> tuple[float, dict[str, float]]:
    """What travels to the GPU machine with the wheels in ``folder``: the checkout's files that git
    tracks or would (untracked, not ignored), in MiB, and the largest top-level folders of it."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    by_top: dict[str, float] = {}
    for name in filter(None, listed):
        path = ROOT / name
        if path.is_file() and folder.absolute() not in path.absolute().parents:
            top = name.split("/", 1)[0]
            by_top[top] = by_top.get(top, 0.0) + path.stat().st_size / 2**20
    return sum(by_top.values()), dict(sorted(by_top.items(), key=lambda item: -item[1]))


def fill(folder: Path, python_version: str, arch: str, have: set[str], extras: set[str]) -> list[Path]:
    """Build the project's wheel into ``folder`` and fetch every dependency (with the project's
    ``extras``) not in ``have``; returns the wheels."""
    folder.mkdir(parents=True, exist_ok=True)
    project = build_project(folder)
    name, requirements = wheel_requirements(project)
    requirements = [requirement for requirement in requirements if needed(requirement, extras, python_version, arch)]
    fetched: dict[str, Path] = {name: project}
    extras_read: dict[str, set[str]] = {name: set(extras)}
    queue = list(requirements)
    while queue:
        requirement = queue.pop(0)
        key = canonicalize_name(requirement.name)
        if key in have:
            continue
        if key not in fetched:
            fetched[key] = fetch(requirement, folder, python_version, arch)
            extras_read[key] = set()
            print(f"  {fetched[key].name}", flush=True)
        elif set(requirement.extras) <= extras_read[key]:
            continue
        # Its dependencies, and those its newly requested extras add (lm-eval[hf]).
        extras = extras_read[key] | set(requirement.extras)
        queue += [dependency for dependency in wheel_requirements(fetched[key])[1]
                  if needed(dependency, extras, python_version, arch)]
        extras_read[key] = extras
    return list(fetched.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="where the wheels go (e.g. .whl in the checkout)")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python, major.minor (3.12)")
    parser.add_argument("--arch", default="x86_64", help="its machine architecture (x86_64)")
    parser.add_argument("--have", type=Path, default=DEFAULT_HAVE,
                        help=f"its installed packages, pip freeze style (default: {DEFAULT_HAVE.relative_to(ROOT)})")
    parser.add_argument("--extras", default="gpu",
                        help="the project's extras to fill, comma-separated (default gpu: fla-core, einops; '' for none)")
    arguments = parser.parse_args()
    have = read_have(arguments.have)
    print(f"Wheels for Python {arguments.python_version} on Linux {arguments.arch} into {arguments.folder}, "
          f"leaving out the {len(have)} packages of {arguments.have}:", flush=True)
    extras = {extra.strip() for extra in arguments.extras.split(",") if extra.strip()}
    wheels = fill(arguments.folder, arguments.python_version, arguments.arch, have, extras)
    size = sum(wheel.stat().st_size for wheel in wheels) / 2**20
    print(f"{len(wheels)} wheels, {size:.1f} MiB, in {arguments.folder}")
    checkout, by_top = travelling_mib(arguments.folder)
    largest = ", ".join(f"{name} {mib:.1f}" for name, mib in list(by_top.items())[:4])
    print(f"travels to the GPU machine: {checkout + size:.1f} MiB of {CARRY_LIMIT_MIB} (the checkout's files "
          f"{checkout:.1f} MiB: {largest}; the wheels {size:.1f} MiB)")
    if checkout + size > CARRY_LIMIT_MIB:
        raise SystemExit(f"that is over the {CARRY_LIMIT_MIB} MiB the device tool carries (it sends this checkout's "
                         "files whole, never a clone beside it): fill fewer wheels (--have), or lighten the "
                         "committed results under experiments/")


if __name__ == "__main__":
    main()
