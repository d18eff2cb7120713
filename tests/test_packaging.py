"""The built wheel installs into a fresh virtual environment with every subpackage."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ["jaxrl_frag", "jaxrl_frag.app", "jaxrl_frag.app.cli", "jaxrl_frag.envs", "jaxrl_frag.sharding",
               "jaxrl_frag.recipes", "jaxrl_frag.transforms"]


def test_wheel_installs_subpackages_under_jaxrl_frag_only(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("jaxrl_frag-*.whl")
    top_level = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert top_level == {"jaxrl_frag", wheel.name.split("-py3")[0] + ".dist-info"}, top_level

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies come from this environment's site-packages (a plain path, so its
    # editable-install hooks stay inactive); the package itself only from the wheel
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True, timeout=300)
    probe = (
        "import importlib, importlib.util, sys\n"
        f"for name in {SUBPACKAGES!r}:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({site!r}), module.__file__\n"
        "assert importlib.util.find_spec('envs') is None and importlib.util.find_spec('sharding') is None\n"
        "assert importlib.util.find_spec('recipes') is None and importlib.util.find_spec('transforms') is None\n"
        "assert importlib.util.find_spec('app') is None\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    script = env_dir / "bin" / "jaxrl-frag"
    assert subprocess.run([str(script), "envs"], capture_output=True, text=True, env=env,
                          timeout=300).stdout.split()[:1] == ["Acrobot-v1"]
