"""Exporting a run folder that was copied or moved, and an export killed midway.

The probe copied a warm-started run (``cp -r r1 r1orig; rm -rf r1``) and trained a new run
into ``r1``: ``agentgym export r1orig`` then merged r1orig's adapter into the NEW run's
``r1/sft``, the absolute path the adapter records, and the merged model was 1.28 nats/token
off. Here the new run is a copy whose warm start has other weights (no training needed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import require
from tests.trainers.test_export import write_run


def warm_started_run(root: Path, tiny: Path) -> Path:
    """A run in ``root/run`` whose adapter was trained on its own ``sft/`` (absolute path)."""
    shutil.copytree(tiny, root / "run" / "sft")
    return write_run(root, (root / "run" / "sft").resolve(), {3: 0})


def another_warm_start(sft: Path) -> None:
    """Give ``sft`` other weights of the same shape: another run's warm start in its place."""
    torch = require("torch")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(torch.randn_like(weight))
    model.save_pretrained(sft)


def embeddings(folder: Path) -> object:
    """The input embeddings of the model in ``folder`` (LoRA leaves them as the base has them)."""
    from safetensors.torch import load_file

    weights = load_file(str(folder / "model.safetensors"))
    return next(w for name, w in weights.items() if name.endswith("embed_tokens.weight"))


def test_a_copied_run_exports_on_its_own_warm_start_not_on_the_folder_it_was_copied_from(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from agentgym.trainers import export_run
    from agentgym.trainers._export import trained_adapter

    torch = require("torch")
    first = warm_started_run(tmp_path, tiny_model_dir)
    copy = tmp_path / "copy"
    shutil.copytree(first, copy)
    another_warm_start(first / "sft")  # a new run trained into the first folder
    own = (copy / "sft").resolve()
    adapter = copy / "checkpoints" / "step-000003" / "adapter"
    assert trained_adapter(copy) == (adapter, own)  # eval --adapter
    merged = export_run(copy, tmp_path / "merged", merge=True)
    assert json.loads((merged / "export.json").read_text())["base_model"] == str(own)
    assert torch.equal(embeddings(merged), embeddings(own))
    assert not torch.equal(embeddings(merged), embeddings(first / "sft"))
    exported = export_run(copy, tmp_path / "exported")  # the adapter alone, then evaluated
    assert trained_adapter(exported) == (exported, own)
    assert trained_adapter(first) == (first / "checkpoints/step-000003/adapter",
                                      (first / "sft").resolve())  # fmt: skip


#: A writer of an export's temporary folder that waits for a line on stdin before it renames
#: the folder into place; ``{opening}`` is how it opens the folder.
WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from agentgym.trainers import _export, _run_dir

    with {opening}(Path(sys.argv[1])) as tmp:
        (tmp / "weights").write_bytes(b"0" * 4096)
        print(tmp, flush=True)
        sys.stdin.readline()
""")


def start_writer(out: Path, opening: str) -> tuple[subprocess.Popen[str], Path]:
    """A process writing into ``out``'s temporary folder; returns it and that folder."""
    script = WRITER.replace("{opening}", opening)
    proc = subprocess.Popen([sys.executable, "-c", script, str(out)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None
    tmp = Path(proc.stdout.readline().strip())  # printed once the folder is there
    assert tmp.name.startswith(".tmp-") and tmp.is_dir(), proc.communicate()
    return proc, tmp


def test_an_export_killed_midway_leaves_no_copy_that_the_next_one_keeps(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A kill -9 left ``.tmp-OUT-xxxxxxxx/`` (the whole merged model, on a real one) forever."""
    from agentgym.trainers import export_run

    run_dir = write_run(tmp_path, tiny_model_dir, {1: 0})
    killed, left = start_writer(tmp_path / "out", "_run_dir.atomic_dir")  # any writer's
    killed.kill()  # SIGKILL: nothing of the writer's own runs
    killed.wait()
    other = tmp_path / ".tmp-out-b-0badf00d"  # another OUT's ("out-b"): not this export's
    other.mkdir()
    assert left.is_dir()
    export_run(run_dir, tmp_path / "out")
    assert not left.exists()
    assert other.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-out-b-0badf00d", "out", "run"]


def test_an_export_keeps_the_folder_a_live_export_to_the_same_out_is_writing(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from agentgym.trainers import export_run

    run_dir = write_run(tmp_path, tiny_model_dir, {1: 0})
    live, writing = start_writer(tmp_path / "out", "_export.export_dir")  # as export_run
    try:
        export_run(run_dir, tmp_path / "out")  # got there first: the live one is refused
        assert (writing / "weights").is_file()
    finally:
        _, said = live.communicate("go\n")
    assert live.returncode == 1 and "was made meanwhile" in said  # its rename, refused
    assert not writing.exists()  # its own writer removed it on the way out
    assert json.loads((tmp_path / "out" / "export.json").read_text())["step"] == 1
