"""VLM data as TRL users keep it (issue 42): conversational prompts with ``{"type": "image"}`` blocks next to an
``image`` / ``images`` column of file paths, PIL images or ``datasets.Image()`` values, from JSONL, Parquet and
``save_to_disk`` folders (data.py's loaders) and from the Python API (api.py); both read the same pictures."""
from __future__ import annotations

import json

import numpy as np
import pytest

REWARD = "def hit(completions, answer, **kw):\n    return [float(a in c) for c, a in zip(completions, answer)]\n"


def _pictures(tmp_path, n=4):
    """``n`` tiny PNGs (a red square at a row-dependent height), their paths and arrays."""
    from PIL import Image
    arrays, paths = [], []
    for i in range(n):
        a = np.full((32, 32, 3), 24, np.uint8)
        a[i * 4:i * 4 + 8, 4:12] = (230, 40, 40)
        Image.fromarray(a).save(tmp_path / f"p{i}.png")
        arrays.append(a)
        paths.append(f"p{i}.png")
    return arrays, paths


def _prompt(i):  # TRL's VLM format: typed blocks, the picture a placeholder
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"Where is it {i}?"}]}]


def _write_every_format(tmp_path):
    """The same 4 rows as JSONL (relative ``image`` paths), Parquet (a ``datasets.Image()`` column of PIL images,
    stored as bytes) and a ``save_to_disk`` folder (an ``images`` list column of ``Image()`` values)."""
    import datasets
    from PIL import Image
    arrays, paths = _pictures(tmp_path)
    rows = [{"prompt": _prompt(i), "image": p, "answer": str(i)} for i, p in enumerate(paths)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    block = {"type": datasets.Value("string"), "text": datasets.Value("string")}
    prompt = [{"role": datasets.Value("string"), "content": [block]}]
    feats = datasets.Features({"prompt": prompt, "image": datasets.Image(), "answer": datasets.Value("string")})
    pil = [{**r, "image": Image.fromarray(a)} for r, a in zip(rows, arrays)]
    datasets.Dataset.from_list(pil, features=feats).to_parquet(str(tmp_path / "rows.parquet"))
    feats = datasets.Features({"prompt": prompt, "images": datasets.Sequence(datasets.Image()),
                               "answer": datasets.Value("string")})
    listed = [{"prompt": r["prompt"], "images": [str(tmp_path / r["image"])], "answer": r["answer"]} for r in rows]
    datasets.Dataset.from_list(listed, features=feats).save_to_disk(str(tmp_path / "disk"))
    return arrays, ["rows.jsonl", "rows.parquet", "disk"]


def test_every_format_reads_the_same_rows_and_trains_from_the_command_line(tmp_path, monkeypatch):
    """JSONL, Parquet and save_to_disk rows load to the same prompts and pixels (a Parquet / datasets struct's
    ``"text": None`` on image blocks is ignored); each trains 1 step of the vision_language policy on the tiny
    LLaVA with a user reward file from the command line."""
    from grpolab.cli import main
    from grpolab.data import load_data
    from grpolab.policies.vision_language.prompts import prompt_messages
    from grpolab.policies.vision_language.scenes import row_images

    arrays, names = _write_every_format(tmp_path)
    (tmp_path / "vision_data_rw.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path.parent)  # relative image paths resolve against the data file's folder
    for name in names:
        rows = load_data(tmp_path / name)
        for i, row in enumerate(rows):
            assert prompt_messages(row, 1) == _prompt(i), name
            assert np.array_equal(row_images(row)[0], arrays[i]), name
        rc = main(["train", "--policy", "vision_language", "--model", "tiny", "--vlm_pretrain_steps", "5",
                   "--data", str(tmp_path / name), "--reward", "vision_data_rw:hit", "--steps", "1", "--prompts_per_step",
                   "2", "--num_generations", "2", "--max_completion_length", "4", "--eval_split", "0",
                   "--save_steps", "100", "--tensorboard", "false", "--quiet", "--threads", "1",
                   "--out", str(tmp_path / f"run_{name}")])
        assert rc == 0 and (tmp_path / f"run_{name}" / "final" / "config.json").exists(), name


def test_the_python_api_reads_a_datasets_image_column_as_the_cli_does(tmp_path):
    """A ``datasets.Dataset`` with an ``Image()`` column and TRL's image blocks given to GRPOTrainer: the rows the
    run trains on hold the same pixels as the CLI's rows of the same file, and a step trains."""
    import datasets

    from grpolab import GRPOConfig, GRPOTrainer
    from grpolab.data import load_data
    from grpolab.policies.vision_language.scenes import row_images

    arrays, _ = _write_every_format(tmp_path)
    ds = datasets.load_dataset("parquet", data_files={"train": str(tmp_path / "rows.parquet")}, split="train")

    def hit(completions, answer, **kw):
        return [float(a in c) for c, a in zip(completions, answer)]

    trainer = GRPOTrainer(model="tiny", reward_funcs=hit, train_dataset=ds, args=GRPOConfig(
        output_dir=str(tmp_path / "api"), max_steps=1, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=4, vlm_pretrain_steps=5, report_to="none", threads=1))
    assert trainer.cfg.policy == "vision_language"
    cli = load_data(tmp_path / "rows.parquet")
    api = trainer.trainer._api["rows"]
    for i in range(4):
        assert np.array_equal(row_images(api[i])[0], row_images(cli[i])[0])
        assert np.array_equal(row_images(api[i])[0], arrays[i])
    trainer.train()
    assert (tmp_path / "api" / "final" / "config.json").exists()


@pytest.mark.parametrize("content, match", [
    ([{"type": "video"}], "is not a content block"),
    ([{"type": "text", "text": 3}], "needs a string 'text'"),
    ([], "empty list"),
])
def test_malformed_blocks_name_the_row_and_the_valid_blocks(tmp_path, content, match):
    from grpolab.data import DataError, load_data

    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": [{"role": "user", "content": content}]}) + "\n")
    with pytest.raises(DataError, match=match) as e:
        load_data(tmp_path / "bad.jsonl")
    assert "bad.jsonl:1" in str(e.value)
