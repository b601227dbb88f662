"""The ``team`` rollout strategy: several roles, one model, talking in turn; one row per role per team episode.

A run holds ``roles`` (at least two): each role is the run's model with its own role prompt and, optionally,
its own view of the data row (a column only that role sees). For every prompt row, ``G`` team episodes are
played. In each of ``team_rounds`` rounds every role speaks once, in the order of ``roles``: the role's turn is
sampled (batched over all live team episodes) from its own context, which is its first prompt (role prompt,
the row's prompt, its view) followed by its earlier turns and the messages the other roles sent since
(``"<role>: <text>"``, as a user message of the chat, ``ENVIRONMENT`` tokens with loss mask 0). With
``team_order: in_turn`` (the default) a message is heard at once, so a later role of a round hears the earlier
ones; with ``simultaneous`` (CoMLRL's MAGRPO, where the agents of a turn generate at the same time) a round's
messages are heard only in the next round. A role's
first prompt is built when it first speaks, so the messages sent before that are part of it. With
``team_channel: off`` no role sees another's messages (the ablation that measures what talking is worth).

The batch has one row per role per team episode, each that role's own episode: its turns ``SAMPLED`` with
their behaviour log-probs, everything else in its context ``ENVIRONMENT``. So every token records the role
that produced it (``step_data["role"]``: the producing role's index for each completion token, -1 for text no
role wrote), and each row its role (``row_data["role"]``, ``columns["role"]``). Groups are formed per role: the
G rows of one role for one prompt are a group (role 0 uses the prompt's own group id, every other role a
fresh one), so advantages are computed per role. Rewards (``team_reward``):

* ``cooperative``: the task's reward functions score the final message of ``team_answer_role`` (default: the
  last role); every role of the team episode gets that reward (a shared reward);
* ``per_role``: each role's row is scored on its own final message;
* ``zero_sum``: two roles; the answer role gets the task's rewards, the other their negation.

Rows of roles with ``trainable: false`` are scored and logged, then left out of the batch (they are not
trained). Metrics: ``team/reward`` (the answer role's), ``team/<role>/reward``, ``team/<role>/turn_tokens``.
Held-out evaluation plays one greedy team episode per row and scores the answer role's final message.

Role specs (``roles``): a list of role names, or of dicts ``{name, prompt, view, trainable}`` (``prompt``:
the role's instruction, put before the row's prompt; ``view``: a data column whose text only this role sees,
put after it; ``trainable``: default true).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ..agents.parsing import Renderer
from ..agents.rollout import MAX_EPISODE_TOKENS, MAX_TURN_TOKENS
from ..errors import ConfigError
from ..generation.plain import eos_token_ids
from ..generation.sampling import completion_counts, per_prompt
from ..generation.turns import Episode, pack_episodes
from ..registry import ROLLOUT_STRATEGIES, param
from ..roles import ROLE_ADAPTERS, ROLES, TEAM_ANSWER_ROLE, Role, acting, parse_roles, role_names

TEAM_REWARDS = ("cooperative", "per_role", "zero_sum")
ROLE_COLUMN = "role"


@dataclass
class Seat:
    """One role's side of one team episode."""
    role: int
    row: dict
    uid: int
    temperature: float
    episode: Episode | None = None  # made when the role first speaks
    inbox: list[tuple[int, str]] = field(default_factory=list)  # (author role, text) not yet shown
    authors: list[int] = field(default_factory=list)  # the producing role of each completion segment
    turns: list[str] = field(default_factory=list)
    finished: bool = False
    ended_by: str = ""


def _first_prompt(role: Role, row: dict, inbox: list[tuple[int, str]], roles: list[Role], tok) -> str:
    """A role's first prompt: its instruction, the row's prompt, its view, the messages sent before it spoke."""
    view = ""
    if role.view is not None:
        if role.view not in row:
            raise ConfigError(f"roles: role {role.name} sees column '{role.view}', which the data row lacks "
                              f"(columns: {', '.join(sorted(k for k in row if k != 'prompt'))})")
        view = str(row[role.view])
    heard = "\n".join(f"{roles[a].name}: {t}" for a, t in inbox)
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return "\n".join(p for p in (role.prompt, prompt, view, heard) if p)
    msgs = [dict(m) for m in prompt]
    if role.prompt:
        msgs = [{"role": "system", "content": role.prompt}] + [m for m in msgs if m["role"] != "system"] \
            if not any(m["role"] == "system" for m in msgs) else \
            [{**m, "content": f"{role.prompt}\n{m['content']}"} if m["role"] == "system" else m for m in msgs]
    tail = "\n".join(p for p in (view, heard) if p)
    if tail:
        msgs.append({"role": "user", "content": tail})
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def _observation(messages: list[tuple[int, str]], roles: list[Role], chat: bool, renderer) -> str:
    return renderer.observation([{"role": "user", "content": f"{roles[a].name}: {t}"} for a, t in messages], chat)


def sample_role_turns(ctx, contexts, budgets, temperatures, model=None):
    """One turn of one role for every live team episode, batched (tests replace it to script the roles)."""
    return ctx.continue_(contexts, max_new_tokens=budgets, temperature=temperatures, stop_strings=[], model=model)


def play_turn(ctx, seats: list[Seat], role: str, author: int, sample, *, turn_tokens: int, episode_tokens: int,
              module, adapters: str, given: bool, text_of) -> list[tuple[int, str]] | None:
    """One batched turn of the unfinished ``seats``, sampled as ``role`` (:func:`grpolab.roles.acting`) by
    ``sample(contexts, budgets, temperatures, model)``: a seat whose episode has no tokens left under
    ``episode_tokens`` ends (``token_budget``), the others write a turn of at most ``turn_tokens``; one that writes
    nothing ends (``no_action``), the others' turns go into their episodes, credited to ``author`` (the role's
    index), with their text ``text_of(ids)``. Returns ``(index in seats, text)`` of the seats that wrote a turn, in
    order, or None when no seat could act. The turn loop of the team and the hierarchical (M-GRPO) rollouts."""
    go = []
    for i, s in enumerate(seats):
        if s.finished:
            continue
        b = min(turn_tokens, episode_tokens - len(s.episode))
        if b <= 0:
            s.finished, s.ended_by = True, "token_budget"
        else:
            go.append((i, b))
    if not go:
        return None
    with acting(module, role, adapters, given=given) as m:
        out = sample([seats[i].episode.context() for i, _ in go], [b for _, b in go],
                     [seats[i].temperature for i, _ in go], m)
    wrote = []
    for (i, _), ids, lps, reason in zip(go, out.ids, out.logprobs, out.finish_reasons):
        s = seats[i]
        if not ids:
            s.finished, s.ended_by = True, "no_action"
            continue
        s.episode.add_model_turn(ids, lps, finish_reason=reason, engine=out.from_engine)
        s.authors.append(author)
        text = text_of(ids)
        s.turns.append(text)
        wrote.append((i, text))
    return wrote


def play_teams(ctx, teams: list[list[Seat]], roles: list[Role], *, rounds: int, channel: bool, turn_tokens: int,
               episode_tokens: int, renderer, model=None, adapters: str = "shared", order: str = "in_turn") -> None:
    """Every team episode to its end: ``rounds`` rounds, each role speaking once per round in order. A role's episode
    (its turns and the messages it hears) is capped at ``max_episode_tokens``, each turn at ``max_turn_tokens``
    (the agent keys). ``adapters``: the ``role_adapters`` value, which model samples a role's turns
    (:func:`grpolab.roles.acting`). ``order`` (``team_order``): ``in_turn``, a message reaches the other roles at
    once (a later role of the round hears it); ``simultaneous``, the round's messages reach them only after every
    role has spoken (CoMLRL's agents generate at the same time and read each other's outputs next turn)."""
    tok = ctx.tokenizer
    eos = set(eos_token_ids(tok, model if model is not None else ctx.policy))

    def text_of(ids):
        return tok.decode([t for t in ids if t not in eos], skip_special_tokens=True).strip()

    for _ in range(rounds):
        held: list[tuple[Seat, int, str]] = []  # simultaneous: (recipient, author, text) delivered after the round
        for r in range(len(roles)):
            seats = [team[r] for team in teams if not team[r].finished]
            for s in seats:
                if s.episode is None:
                    text = _first_prompt(roles[r], s.row, s.inbox, roles, tok)
                    ids = tok(text, add_special_tokens=False)["input_ids"]
                    if len(ids) > ctx.cfg.max_prompt_length:
                        raise ConfigError(f"team: role {roles[r].name}'s first prompt has {len(ids)} tokens, more "
                                          f"than max_prompt_length={ctx.cfg.max_prompt_length}; raise "
                                          f"--max_prompt_length or shorten the role prompt / view")
                    s.episode = Episode(ids)
                elif s.inbox:
                    obs = tok(_observation(s.inbox, roles, not isinstance(s.row["prompt"], str), renderer),
                              add_special_tokens=False)["input_ids"]
                    s.episode.add_observation(obs)
                    s.authors.append(s.inbox[0][0] if len({a for a, _ in s.inbox}) == 1 else -1)
                s.inbox = []
            wrote = play_turn(ctx, seats, roles[r].name, r,
                              lambda c, b, t, m: sample_role_turns(ctx, c, b, t, model=m),
                              turn_tokens=turn_tokens, episode_tokens=episode_tokens,
                              module=model if model is not None else ctx.policy, adapters=adapters,
                              given=model is not None, text_of=text_of)
            for i, text in wrote or []:
                s = seats[i]
                if channel:
                    for other in teams_of(teams, s):
                        if other is s:
                            continue
                        if order == "simultaneous":
                            held.append((other, r, text))
                        else:
                            other.inbox.append((r, text))
        for other, r, text in held:
            other.inbox.append((r, text))
    for team in teams:
        for s in team:
            if not s.finished:
                s.finished, s.ended_by = True, "rounds"


def teams_of(teams: list[list[Seat]], seat: Seat) -> list[Seat]:
    for team in teams:
        if seat in team:
            return team
    raise AssertionError("a seat outside every team")


def _check(cfg) -> None:
    p = cfg.params
    roles = parse_roles(p.get("roles"))
    if p.get("team_reward", "cooperative") not in TEAM_REWARDS:
        raise ConfigError(f"team_reward: '{p.get('team_reward')}' is not valid; valid values: "
                          f"{', '.join(TEAM_REWARDS)}")
    if p.get("team_reward") == "zero_sum" and len(roles) != 2:
        raise ConfigError(f"team_reward zero_sum needs exactly two roles, got {len(roles)}")
    answer = p.get("team_answer_role")
    if answer is not None and answer not in [r.name for r in roles]:
        raise ConfigError(f"team_answer_role: '{answer}' is none of the roles ({', '.join(r.name for r in roles)})")
    if int(p.get("team_rounds", 1)) < 1:
        raise ConfigError(f"team_rounds must be >= 1, got {p.get('team_rounds')}")
    check_role_adapters(cfg)
    if p.get("team_channel", "on") not in ("on", "off"):
        raise ConfigError(f"team_channel: '{p.get('team_channel')}' is not valid; valid values: on, off")


def check_role_adapters(cfg) -> None:
    """What each ``role_adapters`` value needs: lora needs use_lora; separate one process, the native sampler and
    no use_lora."""
    p = cfg.params
    if p.get("role_adapters", "shared") == "lora" and not cfg.use_lora:
        raise ConfigError("role_adapters: lora gives every role its own LoRA adapter and needs use_lora: true "
                          "(--use_lora true); or set role_adapters: shared")
    if p.get("role_adapters") == "separate" and cfg.use_lora:
        raise ConfigError("role_adapters: separate gives every role a full copy of the model; with use_lora: true "
                          "use role_adapters: lora (one adapter per role on one base) instead")
    if p.get("role_adapters") == "separate" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("role_adapters: separate trains in one process; run it without --nproc_per_node / "
                          "torchrun, or use role_adapters: lora")
    if p.get("role_adapters") == "separate" and cfg.generation_engine != "native":
        raise ConfigError(f"role_adapters: separate samples each role with its own model in this process; a "
                          f"vLLM engine (generation_engine: {cfg.generation_engine}) holds one model; set "
                          f"generation_engine: native or role_adapters: lora")


def _pack(ctx, teams: list[list[Seat]], roles: list[Role], group_ids: list[list[int]], episode_tokens: int):
    """One row per seat (team-major, roles in order); per-token producing role in ``step_data['role']``."""
    seats = [s for team in teams for s in team]
    for s in seats:  # a role that never spoke (its team mates ended the episode first) has an empty turn
        if s.episode is None:
            s.episode = Episode(ctx.tokenizer(_first_prompt(roles[s.role], s.row, s.inbox, roles, ctx.tokenizer),
                                              add_special_tokens=False)["input_ids"])
    batch = pack_episodes(ctx.tokenizer, [s.episode for s in seats], [s.row for s in seats],
                          uids=[s.uid for s in seats], group_ids=[g for gs in group_ids for g in gs],
                          max_length=episode_tokens, logprobs_fn=ctx.logprobs, is_cap=ctx.cfg.vllm_is_cap)
    T = batch.completion_ids.shape[1]
    producer = torch.full((len(seats), T), -1, dtype=torch.long)
    for i, s in enumerate(seats):
        at = 0
        for seg, author in zip(s.episode.segments, s.authors):
            n = min(len(seg.ids), T - at)
            producer[i, at:at + n] = author
            at += n
    batch.step_data["role"] = producer * batch.completion_attention_mask.long() - (
        1 - batch.completion_attention_mask.long())
    batch.row_data["role"] = torch.tensor([s.role for s in seats], dtype=torch.long)
    batch.columns[ROLE_COLUMN] = [roles[s.role].name for s in seats]
    chat = [not isinstance(s.row["prompt"], str) for s in seats]
    finals = [s.turns[-1] if s.turns else "" for s in seats]
    batch.columns["completion"] = [[{"role": "assistant", "content": t}] if c else t for t, c in zip(finals, chat)]
    batch.columns["team_transcript"] = [[{"role": roles[s.role].name, "turns": list(s.turns),
                                          "ended_by": s.ended_by} for s in team] for team in teams
                                        for _ in team]
    batch.truncated = torch.tensor([s.episode.truncated for s in seats], dtype=torch.bool)
    return batch


def _team_rewards(batch, n_roles: int, answer: int, mode: str) -> None:
    """Rewards per role from each team episode's scored rows (rows are team-major, ``n_roles`` per team)."""
    if mode == "per_role":
        return
    rewards = batch.rewards.view(-1, n_roles, batch.rewards.shape[1])
    shared = rewards[:, answer:answer + 1, :].clone()
    if mode == "cooperative":
        rewards.copy_(shared.expand_as(rewards))
    else:  # zero_sum, two roles
        rewards[:, answer] = shared[:, 0]
        rewards[:, 1 - answer] = -shared[:, 0]


@ROLLOUT_STRATEGIES.register("team", check=_check, needs=("text",))
def team(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
         roles: list = ROLES, role_adapters: str = ROLE_ADAPTERS,
         team_rounds: int = param(1, "team: rounds per team episode (each role speaks once per round, in order)"),
         team_reward: str = param("cooperative", "team: cooperative (every role gets the answer role's reward), "
                                  "per_role (each role scored on its own final message), zero_sum (two roles: "
                                  "the other role gets the negated reward)", list(TEAM_REWARDS)),
         team_answer_role: str | None = TEAM_ANSWER_ROLE,
         team_channel: str = param("on", "team: on (roles see each other's messages) or off (each role alone: "
                                   "the ablation that measures what talking is worth)", ["on", "off"]),
         team_order: str = param("in_turn", "team: in_turn (a role hears the messages of the roles before it in "
                                 "the same round) or simultaneous (every role of a round speaks without hearing "
                                 "that round's messages, which arrive in the next round: CoMLRL's MAGRPO)",
                                 ["in_turn", "simultaneous"]),
         max_turn_tokens: int = MAX_TURN_TOKENS, max_episode_tokens: int = MAX_EPISODE_TOKENS):
    """G team episodes per prompt, one row per role per episode, groups per role (the module docstring).

    Provenance: reconstructed from the abstract — the multi-agent, multi-turn rollout of MAGRPO (LLM
    Collaboration With Multi-Agent Reinforcement Learning, seed 000-40; authors' code OpenMLRL/CoMLRL
    comlrl/trainers/reinforce/magrpo.py as described in the project's reference notes: n agents with their own
    role prompts, joint actions aligned (the i-th completion of every agent together), one joint reward per
    joint action, each agent's advantage against its siblings at the same node); grpolab's choices: the roles
    hear each other as user messages, one reward per team episode (no per-turn rewards), one row per role. The
    order within a round is ``team_order``: ``in_turn`` (grpolab's, a later role hears the earlier ones of the
    same round) or ``simultaneous`` (CoMLRL's: the agents of a turn generate at once; recipe ``magrpo``). Test:
    tests/test_team.py::test_simultaneous_roles_hear_each_other_only_in_the_next_round.
    """
    role_list = parse_roles(roles)
    n = len(role_list)
    answer = n - 1 if team_answer_role is None else [r.name for r in role_list].index(team_answer_role)
    cfg = ctx.cfg
    counts = completion_counts(cfg.num_generations if budgets is None else budgets, len(rows))
    temps = per_prompt(cfg.temperature if temperatures is None else temperatures, len(rows), "temperature")
    bases = [group_offset] + [ctx.allocate_groups(len(rows)) for _ in range(n - 1)]
    teams, gids = [], []
    for i, (row, uid, c, t) in enumerate(zip(rows, uids, counts, temps)):
        for _ in range(c):
            teams.append([Seat(r, row, uid, float(t)) for r in range(n)])
            gids.append([bases[r] + i for r in range(n)])
    renderer = Renderer(ctx.tokenizer, log=ctx.log)
    if team_order not in ("in_turn", "simultaneous"):
        raise ConfigError(f"team_order: '{team_order}' is not valid; valid values: in_turn, simultaneous")
    play_teams(ctx, teams, role_list, rounds=team_rounds, channel=team_channel == "on",
               turn_tokens=max_turn_tokens or cfg.max_completion_length, episode_tokens=max_episode_tokens,
               renderer=renderer, adapters=role_adapters, order=team_order)
    batch = _pack(ctx, teams, role_list, gids, max_episode_tokens)
    ctx.score(batch)
    _team_rewards(batch, n, answer, team_reward)
    scalar = ctx.scalar(batch)
    role_idx = batch.row_data["role"]
    lengths = (batch.completion_mask > 0).sum(-1).float()
    for r, role in enumerate(role_list):
        sel = role_idx == r
        ctx.metric(f"team/{role.name}/reward", float(torch.nanmean(scalar[sel])))
        ctx.metric(f"team/{role.name}/turn_tokens", float(lengths[sel].mean()))
    ctx.metric("team/reward", float(torch.nanmean(scalar[role_idx == answer])))
    keep = [i for i, r in enumerate(role_idx.tolist()) if role_list[r].trainable]
    return batch if len(keep) == len(role_idx) else batch.select(keep)


def eval_rollout(ctx, model, rows, uids, *, roles, team_rounds, team_answer_role, team_channel, max_turn_tokens,
                 max_episode_tokens, role_adapters="shared", team_order="in_turn", **_ignored):
    """Held-out evaluation: one greedy team episode per row. The answer role's rows make the team's figures;
    every role's rows, each scored by the task's rewards on that role's own final message, are reported as
    ``roles/<role>/...`` (grpolab/train/evaluate.py)."""
    role_list = parse_roles(roles)
    n = len(role_list)
    answer = n - 1 if team_answer_role is None else [r.name for r in role_list].index(team_answer_role)
    teams = [[Seat(r, row, uid, 0.0) for r in range(n)] for row, uid in zip(rows, uids)]
    play_teams(ctx, teams, role_list, rounds=team_rounds, channel=team_channel == "on",
               turn_tokens=max_turn_tokens or ctx.cfg.max_completion_length, episode_tokens=max_episode_tokens,
               renderer=Renderer(ctx.tokenizer, log=ctx.log), model=model, adapters=role_adapters, order=team_order)
    batch = _pack(ctx, teams, role_list, [[i] * n for i in range(len(rows))], max_episode_tokens)
    per_role = {f"roles/{role.name}": batch.select([t * n + r for t in range(len(rows))])
                for r, role in enumerate(role_list)}
    return per_role[f"roles/{role_list[answer].name}"], per_role


def model_texts(cfg, environment, rows: list[dict]) -> list[str]:
    """Text the team shows besides the data (role names, instructions, the ``name: message`` form), for a
    tokenizer built from the run's text (``--model tiny``)."""
    return [f"{r.name}: {r.prompt}" for r in parse_roles(cfg.params.get("roles"))]


def lora_adapters(cfg) -> list[str]:
    """The LoRA adapters the policy makes for this run (``role_adapters: lora``: one per role, named after it)."""
    return role_names(cfg.params.get("roles")) if cfg.params.get("role_adapters") == "lora" else []


def role_models(cfg) -> list[str]:
    """The roles that get a model of their own (``role_adapters: separate``: every role, a copy of the run's)."""
    return role_names(cfg.params.get("roles")) if cfg.params.get("role_adapters") == "separate" else []


team.eval_rollout = eval_rollout
team.lora_adapters = lora_adapters
team.role_models = role_models
team.model_texts = model_texts
team.columns = (ROLE_COLUMN, "team_transcript")  # reward functions may take them
