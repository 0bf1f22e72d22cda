"""Two SFT runs into one OUT: the second is refused in one line naming the first's pid.

Both used to train and both said "output folder: OUT"; the model of one was silently lost
(and with the same knobs both wrote one ``OUT.partial/`` checkpoint).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from agentgym._errors import ConfigError
from tests.trainers.test_sft_cli import AGENTGYM, ENV_ARG, agentgym_cli, one_error_line


def test_a_folder_held_by_a_writer_is_refused_naming_its_pid(tmp_path: Path) -> None:
    from agentgym.trainers._sft import _sole_writer

    out = tmp_path / "o"
    folder = tmp_path / "o.partial"
    with _sole_writer(folder, out):
        with pytest.raises(ConfigError, match=f"by SFT process {os.getpid()} on this host"):
            with _sole_writer(folder, out):
                pass
        assert (folder / "owner.json").is_file()
    assert not folder.exists()  # no checkpoint was saved: nothing left behind
    with _sole_writer(folder, out):  # released: the next run takes it
        pass


def test_a_second_sft_into_the_same_out_is_refused_while_the_first_trains(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "cc"
    args = ["--env", "calculator", "--tasks", "0:8", "--steps", "2000", "--batch-size", "2",
            "--save-every", "0", *ENV_ARG]  # fmt: skip
    env = {**os.environ, "NO_COLOR": "1", "AGENTGYM_RUNS_DB": "off"}
    command = [str(AGENTGYM), "sft", str(tiny_model_dir), str(out), *args]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        owner = tmp_path / "cc.partial" / "owner.json"
        while not owner.exists():  # the first holds OUT from here until its model is saved
            assert first.poll() is None, "the first run ended before it held OUT"
            time.sleep(0.01)
        second = agentgym_cli("sft", tiny_model_dir, out, *args, "--lr", "0.001")
        line = one_error_line(second)
        assert f"being written by SFT process {first.pid} on this host" in line, line
    finally:
        first.kill()
        first.wait()
