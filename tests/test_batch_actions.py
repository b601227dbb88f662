"""RolloutBatch.step_data / row_data: non-token actions travel with their rows (docs/design/policies.md §2).

Hand-built tiny batches (R = 2..4 rows, T = 2..5 steps) with ``step_data {"x": [R, T, 3]}`` and ``row_data
{"cond": [R]}``; every value says which row and step it belongs to, so a row that lands in the wrong place shows.
"""
import dataclasses
import pickle
import types

import pytest
import torch

from grpolab.batch import RolloutBatch
from grpolab.distributed import collective
from grpolab.distributed.trainer import DistributedTrainer
from grpolab.rollouts.lc_r1 import crop_rows
from grpolab.train import checkpoint as ckpt


def _x(uids: list[int], T: int) -> torch.Tensor:
    """``x[i, j, c] = 100 * uid_i + 10 * j + c + 1`` (never 0, so padding zeros are told apart)."""
    u = torch.tensor(uids, dtype=torch.float32).view(-1, 1, 1)
    j = torch.arange(T, dtype=torch.float32).view(1, -1, 1)
    c = torch.arange(3, dtype=torch.float32).view(1, 1, -1)
    return 100 * u + 10 * j + c + 1


def _batch(lengths: list[int], T: int, uids: list[int] | None = None, actions: bool = True,
           group: int = 0) -> RolloutBatch:
    R = len(lengths)
    uids = list(range(R)) if uids is None else uids
    mask = (torch.arange(T).view(1, -1) < torch.tensor(lengths).view(-1, 1)).float()
    extra = {"step_data": {"x": _x(uids, T)}, "row_data": {"cond": torch.tensor(uids, dtype=torch.long) * 7}} \
        if actions else {}
    return RolloutBatch(prompt_ids=torch.ones(R, 2, dtype=torch.long), prompt_mask=torch.ones(R, 2, dtype=torch.long),
                        completion_ids=(torch.arange(T).view(1, -1) + 1).repeat(R, 1) * mask.long(),
                        completion_mask=mask, behavior_logprobs=-mask, group_ids=torch.full((R,), group),
                        prompt_uids=torch.tensor(uids), truncated=torch.zeros(R, dtype=torch.bool),
                        columns={"prompt": [f"p{u}" for u in uids]}, **extra)


def _check_rows(b: RolloutBatch) -> None:
    """Every row's step_data / row_data is its own (by ``prompt_uids``) over the batch's T steps."""
    T = b.completion_ids.shape[1]
    uids = b.prompt_uids.tolist()
    assert set(b.step_data) == {"x"} and set(b.row_data) == {"cond"}
    assert b.step_data["x"].shape == (len(uids), T, 3)
    assert torch.equal(b.step_data["x"], _x(uids, T))
    assert b.row_data["cond"].tolist() == [7 * u for u in uids]


# ----------------------------------------------------------------------------- text batches: unchanged
def test_a_text_batch_has_empty_dicts_everywhere():
    a, b = _batch([2, 3], 3, actions=False), _batch([4, 1, 2], 4, uids=[5, 6, 7], actions=False)
    assert [f.name for f in dataclasses.fields(RolloutBatch)][-2:] == ["step_data", "row_data"]  # positional args
    for out in (a, RolloutBatch.concat([a, b]), a.select([1]), b.trim(), *b.micro_batches(2), a.to("cpu")):
        assert out.step_data == {} and out.row_data == {}
    assert a.step_data is not b.step_data  # default_factory: no shared dict
    c = RolloutBatch.concat([a, b])
    assert c.completion_ids.shape == (5, 4) and c.completion_ids[:2, 3].tolist() == [0, 0]


# ----------------------------------------------------------------------------- construction
def test_wrong_shapes_name_the_field_the_key_and_both_shapes():
    good = _batch([2, 3], 4)
    bad = {"step_data": {"x": torch.zeros(2, 5, 3)}}
    with pytest.raises(ValueError, match=r"step_data\['x'\] has shape \(2, 5, 3\), expected \(2, 4, \.\.\.\)"):
        dataclasses.replace(good, **bad)
    with pytest.raises(ValueError, match=r"step_data\['y'\] has shape \(2,\), expected \(2, 4, \.\.\.\)"):
        dataclasses.replace(good, step_data={"x": good.step_data["x"], "y": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"row_data\['cond'\] has shape \(3,\), expected \(2, \.\.\.\)"):
        dataclasses.replace(good, row_data={"cond": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"row_data\['cond'\] is a list"):
        dataclasses.replace(good, row_data={"cond": [1, 2]})
    ok = dataclasses.replace(good, step_data={"s": torch.zeros(2, 4)}, row_data={"img": torch.zeros(2, 1, 8, 8)})
    assert ok.step_data["s"].shape == (2, 4)  # [R, T] alone is a per-step tensor too


# ----------------------------------------------------------------------------- row and step operations
def test_select_indexes_the_rows_of_both_dicts():
    b = _batch([2, 4, 3, 1], 4, uids=[10, 11, 12, 13])
    s = b.select([2, 0])
    assert s.prompt_uids.tolist() == [12, 10]
    _check_rows(s)
    assert torch.equal(s.step_data["x"], b.step_data["x"][[2, 0]])
    assert s.step_data is not b.step_data and s.row_data is not b.row_data
    assert torch.equal(b.select(torch.tensor([3])).row_data["cond"], torch.tensor([91]))


def test_concat_right_pads_step_data_with_zeros_and_stacks_row_data():
    a = _batch([1, 2], 2, uids=[1, 2])                # T = 2
    b = _batch([5, 3, 4], 5, uids=[3, 4, 5], group=1)  # T = 5
    c = RolloutBatch.concat([a, b])
    x = c.step_data["x"]
    assert x.shape == (5, 5, 3) and c.completion_ids.shape == (5, 5)
    assert torch.equal(x[:2, :2], _x([1, 2], 2)) and torch.equal(x[2:], _x([3, 4, 5], 5))
    assert bool((x[:2, 2:] == 0).all())                          # the padding: zeros at the right of a's rows
    assert bool((c.completion_mask[:2, 2:] == 0).all())          # where the mask is 0 too
    assert c.row_data["cond"].tolist() == [7, 14, 21, 28, 35]
    back = RolloutBatch.concat([b, a])                           # the other order: padding after a's rows again
    assert torch.equal(back.step_data["x"][3:, :2], _x([1, 2], 2)) and bool((back.step_data["x"][3:, 2:] == 0).all())
    assert RolloutBatch.concat([a]) is a


def test_concat_refuses_batches_with_different_keys():
    a, b = _batch([1, 2], 2), _batch([2, 3], 3, uids=[2, 3])
    no_x = dataclasses.replace(b, step_data={})
    with pytest.raises(ValueError, match=r"batch 1 of 2 has no step_data\['x'\] \(batch 0 has it\)"):
        RolloutBatch.concat([a, no_x])
    with pytest.raises(ValueError, match=r"batch 0 of 3 has no step_data\['x'\] \(batch 1 has it\)"):
        RolloutBatch.concat([no_x, a, b])
    extra = dataclasses.replace(b, row_data={**b.row_data, "noise": torch.zeros(2, 4)})
    with pytest.raises(ValueError, match=r"batch 0 of 2 has no row_data\['noise'\] \(batch 1 has it\)"):
        RolloutBatch.concat([a, extra])


def test_trim_slices_step_data_to_the_used_steps():
    b = _batch([2, 3], 5)
    t = b.trim()
    assert t.completion_ids.shape == (2, 3) and t.step_data["x"].shape == (2, 3, 3)
    assert torch.equal(t.step_data["x"], b.step_data["x"][:, :3])
    assert torch.equal(t.row_data["cond"], b.row_data["cond"])
    full = _batch([5, 3], 5)
    assert full.trim() is full


@pytest.mark.parametrize("kw", [{"rows": 3}, {"rows": 2, "trim": False}, {"rows": 4, "max_tokens": 12},
                                {"rows": 1}])
def test_micro_batches_carry_each_rows_data(kw):
    b = _batch([2, 5, 1, 3], 5, uids=[20, 21, 22, 23])
    mbs = b.micro_batches(**kw)
    assert sum(mb.num_rows for mb in mbs) == 4 and len(mbs) > 1
    seen = []
    for mb in mbs:
        _check_rows(mb)  # every row's data is in the micro-batch that holds the row, cut to its width
        seen += mb.prompt_uids.tolist()
        if kw.get("trim", True):
            assert mb.completion_ids.shape[1] == int(mb.completion_attention_mask.sum(-1).max())
    assert seen == [20, 21, 22, 23]


def test_to_moves_every_value():
    b = _batch([2, 3], 3)
    assert b.to("cpu") is b  # all on the device already
    meta = b.to("meta")
    assert all(v.device.type == "meta" for d in (meta.step_data, meta.row_data) for v in d.values())
    assert meta.completion_ids.device.type == "meta"
    # completion tensors already there, the step data not (kept on the CPU until the micro-batch moves)
    half = dataclasses.replace(meta, step_data={"x": b.step_data["x"]})
    moved = half.to("meta")
    assert moved is not half and moved.step_data["x"].device.type == "meta"


def test_crop_rows_cuts_step_data_like_the_tokens():
    b = _batch([4, 3], 4, uids=[1, 2])
    out = crop_rows(b, {0: (1, 3)}, pad_id=0)  # row 0 keeps steps 0, 3; row 1 all three
    assert out.completion_ids.shape == (2, 3)
    x = out.step_data["x"]
    assert torch.equal(x[0, :2], _x([1], 4)[0, [0, 3]]) and bool((x[0, 2] == 0).all())
    assert torch.equal(x[1], _x([2], 4)[0, :3])
    assert torch.equal(out.row_data["cond"], b.row_data["cond"])
    assert crop_rows(_batch([2, 1], 2, actions=False), {0: (0, 1)}, pad_id=0).step_data == {}


# ----------------------------------------------------------------------------- checkpoints
def _save(tmp_path, state):
    torch.save({"format": ckpt.FORMAT, "state": state}, tmp_path / "state.pt")
    return ckpt.read_state(tmp_path)


def test_a_checkpoint_written_before_the_fields_existed_loads_with_empty_dicts(tmp_path):
    old = _batch([1, 2], 2, actions=False)
    state = ckpt.encode_state({"buffer": [old], "step": 3})
    for enc in state["buffer"]:  # what today's code wrote: the dataclass's fields, without the two new ones
        assert enc["fields"].pop("step_data") == {} and enc["fields"].pop("row_data") == {}
        assert "step_data" not in enc["fields"]
    back = _save(tmp_path, state)["buffer"][0]
    assert isinstance(back, RolloutBatch) and back.step_data == {} and back.row_data == {}
    assert torch.equal(back.completion_ids, old.completion_ids) and back.columns == old.columns
    joined = RolloutBatch.concat([back, _batch([3], 3, uids=[9], actions=False)])  # and it trains on
    assert joined.step_data == {} and joined.num_rows == 3
    assert back.micro_batches(1)[1].step_data == {}


def test_a_new_checkpoint_round_trips_both_dicts(tmp_path):
    b = _batch([2, 3, 1], 3, uids=[4, 5, 6])
    back = _save(tmp_path, ckpt.encode_state({"buffer": [b]}))["buffer"][0]
    _check_rows(back)
    assert back.step_data["x"].dtype == torch.float32 and back.row_data["cond"].dtype == torch.long


def test_a_format_1_checkpoint_pickled_before_the_fields_existed_loads(tmp_path):
    old = _batch([2, 1], 2, actions=False)
    del old.__dict__["step_data"], old.__dict__["row_data"]  # a RolloutBatch object pickled by older grpolab
    torch.save({"optimizer": {}, "step": 2, "buffer": [old]}, tmp_path / "state.pt")
    back = ckpt.read_state(tmp_path)["buffer"][0]  # the restricted unpickler, RolloutBatch allowed
    assert back.step_data == {} and back.row_data == {}
    assert RolloutBatch.concat([back, _batch([1], 1, actions=False)]).step_data == {}


# ----------------------------------------------------------------------------- ranks
def test_pickled_batches_keep_their_data():
    b = _batch([3, 1], 3, uids=[7, 8])
    back = pickle.loads(pickle.dumps(b))
    _check_rows(back)
    assert collective.all_gather_objects(b) == [b]  # one process: the identity


def test_run_strategy_gathers_the_ranks_batches_with_their_data(monkeypatch):
    """DistributedTrainer.run_strategy on rank 0 of 2: each rank's scored batch goes through pickling (as
    ``all_gather_object`` sends it) and the rank-ordered concat keeps every row's step_data / row_data."""
    lengths = {0: [2, 3], 1: [1], 2: [4, 2, 1]}  # per prompt: completions of different lengths

    def strategy(ctx, rows, uids, group_offset, budgets, temperatures, step):
        parts = [_batch(lengths[u], max(lengths[u]), uids=[10 * u + i for i in range(len(lengths[u]))],
                        group=group_offset + k) for k, u in enumerate(uids)]
        out = RolloutBatch.concat(parts)
        return dataclasses.replace(out, rewards=torch.zeros(out.num_rows, 1))

    fake = types.SimpleNamespace(world_size=2, rank=0, strategy=strategy, ctx=types.SimpleNamespace(reward_errors=0),
                                 rows=[{}, {}, {}], scorer=None, step=1, cfg=types.SimpleNamespace(),
                                 policy=types.SimpleNamespace(pad_id=0), generator=torch.Generator(),
                                 sample_generator=torch.Generator())

    def gather(obj):  # what rank 1 drew: its block of the prompts
        lo, hi = collective.shard_bounds(3, 1, 2)
        other = (strategy(None, [{}] * (hi - lo), list(range(lo, hi)), group_offset=lo, budgets=None,
                          temperatures=None, step=1), 0, (torch.Generator().get_state(), torch.Generator().get_state()))
        return [pickle.loads(pickle.dumps(o)) for o in (obj, other)]

    monkeypatch.setattr(collective, "all_gather_objects", gather)
    batch = DistributedTrainer.run_strategy(fake, [0, 1, 2], 0, None, None)
    assert batch.prompt_uids.tolist() == [0, 1, 10, 20, 21, 22]
    assert batch.completion_ids.shape == (6, 4)
    _check_rows(batch.select([3, 4, 5]))  # rank 1's rows: T = 4, nothing padded
    x = batch.step_data["x"]
    lo, _ = collective.shard_bounds(3, 1, 2)
    n0 = sum(len(lengths[u]) for u in range(lo))  # rank 0's rows, padded from their own T to 4
    T0 = max(max(lengths[u]) for u in range(lo))
    assert T0 < 4 and torch.equal(x[:n0, :T0], _x(batch.prompt_uids[:n0].tolist(), T0))
    assert bool((x[:n0, T0:] == 0).all())
    assert batch.row_data["cond"].tolist() == [7 * u for u in [0, 1, 10, 20, 21, 22]]
