"""Theory papers of the control seeds as small tabular experiments (numpy; no GRPO pipeline).

Three papers' experiments, each a function returning its measured table (a list of dicts), printed by
``python scripts/theory_experiments.py <name|all> [seed]``, names grouping, grouping_corrected,
grouping_decomposed, lpo, lpo_kernel, agnostic, spanning:

- :func:`grouping_experiment` — optimal action grouping in action-wise similar MDPs (seed 000-80): coarser
  groupings win with few samples, finer ones with many, and the grouping chosen by minimising an estimated
  (approximation + estimation) bound follows the better side; :func:`grouping_decomposition_experiment` adds
  the transition and reward parts of the linear decomposition (:func:`decomposed_model`).
- :func:`lpo_experiment` — low-switching policy optimisation (seed 000-111): the behaviour policy is replaced
  only when the accumulated sensitivity of the data since the last switch reaches log 2 (the determinant of
  the feature covariance doubles), so the number of switches grows like ``d log T`` while the return reaches
  near-optimal; compared with replacing it every episode. :func:`lpo_kernel_experiment`: the general
  function-class algorithm with a kernel class and online sensitivity sampling (:func:`train_lpo_kernel`)
  against the tabular one.
- :func:`agnostic_experiment` — agnostic policy learning (seed 000-105): a policy class that does not contain
  the optimal policy, the best-in-class policy found by enumeration, and the suboptimality against it, as the
  number of episodes grows, of the empirical-risk minimiser over the class and of group-relative policy gradient
  (GRPO's ``group_zscore`` advantages) in the class's softmax relaxation; :func:`spanning_experiment`: the
  thesis's generative-access algorithm under bounded spanning capacity (:func:`spanning_erm`) against it.

GRAPE's generalised relative advantage (seed 000-46) is a pipeline component: the advantage ``grape``
(algorithms/adv_grape.py). The experiments are deliberately tabular: the papers' claims are about sample counts,
switch counts and value gaps, which exact planning on a small MDP measures without noise from function
approximation. docs/control.md has the tables and the commands.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np
import torch

from ..registry import ADVANTAGES


# ============================================================ tabular MDP tools (discounted and episodic)
def discounted_q(P: np.ndarray, R: np.ndarray, gamma: float, iters: int = 2000, tol: float = 1e-10) -> np.ndarray:
    """Optimal ``Q*[s, a]`` of a discounted MDP by value iteration (``P[s, a, s']``, ``R[s, a]``)::

        Q <- R + gamma * P @ max_a Q      until the sup-norm change is below ``tol``."""
    Q = np.zeros_like(R, dtype=np.float64)
    for _ in range(iters):
        Qn = R + gamma * P @ Q.max(1)
        if np.abs(Qn - Q).max() < tol:
            return Qn
        Q = Qn
    return Q


def discounted_value(P: np.ndarray, R: np.ndarray, gamma: float, pi: np.ndarray) -> np.ndarray:
    """Exact ``V^pi[s]`` of a stochastic policy ``pi[s, a]``: ``V = (I - gamma P_pi)^-1 R_pi``."""
    S = P.shape[0]
    P_pi = np.einsum("sa,sat->st", pi, P)
    R_pi = (pi * R).sum(1)
    return np.linalg.solve(np.eye(S) - gamma * P_pi, R_pi)


def episodic_q(P: np.ndarray, R: np.ndarray, H: int, pi: np.ndarray | None = None,
               bonus: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Backward induction on a finite-horizon MDP (``P[s, a, s']``, ``R[s, a]``, steps ``h = 0..H-1``).

    ``Q_h = min(H - h, R + bonus_h + P V_{h+1})``, ``V_h = max_a Q_h`` (optimal) or ``sum_a pi_h Q_h`` (policy
    ``pi[h, s, a]``); ``V_H = 0``. The clip at ``H - h`` (the most reward left when rewards lie in [0, 1]) keeps
    an optimistic bonus from inflating values past their range. Returns ``(Q[h, s, a], V[h, s])``.
    """
    S, A = R.shape
    Q = np.zeros((H, S, A))
    V = np.zeros((H + 1, S))
    for h in range(H - 1, -1, -1):
        q = R + P @ V[h + 1]
        if bonus is not None:
            q = q + bonus[h]
        Q[h] = np.minimum(q, H - h)
        V[h] = Q[h].max(1) if pi is None else (pi[h] * Q[h]).sum(1)
    return Q, V[:H]


# ============================================================ 000-80: optimal action grouping
@dataclass
class GroupedMDP:
    """A discounted tabular MDP whose actions form latent groups (``labels[level][a]``: a's group at each level
    of the hierarchy, coarse to fine) and the noise of its reward observations."""
    P: np.ndarray            # [S, A, S]
    R: np.ndarray            # [S, A] mean rewards in [0, 1]
    gamma: float
    reward_noise: float      # std of the Gaussian noise on each observed reward
    branching: tuple[int, ...] = ()   # groups per level of the latent hierarchy (coarse to fine)


def action_similar_mdp(n_states: int = 4, branching: tuple[int, ...] = (4, 4), spread: tuple[float, ...] = (1.0, 0.2),
                       gamma: float = 0.9, reward_noise: float = 1.5, seed: int = 0,
                       state_independent_fine: bool = False) -> GroupedMDP:
    """A random action-wise similar MDP: ``A = prod(branching)`` actions in a hierarchy of latent groups.

    At each level ``l`` every node draws a transition row ``q_l(.|s) ~ Dirichlet(1)`` and a reward ``u_l(s) ~
    U(0, 1)``; an action's model is the mixture of the nodes on its path, weighted by ``spread`` (normalised)::

        P(.|s, a) = sum_l w_l q_{l, node_l(a)}(.|s),   R(s, a) = sum_l w_l u_{l, node_l(a)}(s)

    So two actions that share their coarse group differ only by the finer levels' weight: the larger the shared
    prefix, the more similar their transitions and rewards (the "action-wise similar" structure of the paper).
    Rewards are observed with Gaussian noise of std ``reward_noise``.

    With ``state_independent_fine`` every level below the first draws one row ``q_l(.)`` and one reward ``u_l``
    per node for all states (``q_l(.|s) = q_l(.)``): then an action differs from its coarse group's mean by the
    same vector in every state, the form the linear decomposition of :func:`decomposed_model` fits exactly.
    """
    rng = np.random.default_rng(seed)
    w = np.asarray(spread, dtype=np.float64)
    w = w / w.sum()
    A = int(np.prod(branching))
    S = n_states
    P = np.zeros((S, A, S))
    R = np.zeros((S, A))
    nodes = 1
    for level, b in enumerate(branching):
        nodes *= b
        if state_independent_fine and level > 0:
            q = np.repeat(rng.dirichlet(np.ones(S), size=(nodes, 1)), S, axis=1)     # same row in every s
            u = np.repeat(rng.uniform(0.0, 1.0, size=(nodes, 1)), S, axis=1)
        else:
            q = rng.dirichlet(np.ones(S), size=(nodes, S))   # [node, s, s']
            u = rng.uniform(0.0, 1.0, size=(nodes, S))       # [node, s]
        for a in range(A):
            node = a // (A // nodes)
            P[:, a] += w[level] * q[node]
            R[:, a] += w[level] * u[node]
    return GroupedMDP(P=P, R=R, gamma=gamma, reward_noise=reward_noise, branching=tuple(branching))


def action_profiles(P: np.ndarray, R: np.ndarray) -> np.ndarray:
    """One vector per action: its transition rows over all states and its rewards, ``[A, S*S + S]``."""
    S, A, _ = P.shape
    return np.concatenate([P.transpose(1, 0, 2).reshape(A, S * S), R.T], axis=1)


def grouping_family(P: np.ndarray, R: np.ndarray) -> list[np.ndarray]:
    """Nested groupings of the actions by similarity: average-linkage agglomerative clustering of the action
    profiles (L1 distance), from ``A`` singleton groups down to one group. Returns one label array ``[A]`` per
    number of groups ``k = 1..A`` (``family[k - 1]``), labels numbered ``0..k-1`` in order of first action."""
    X = action_profiles(P, R)
    A = X.shape[0]
    D = np.abs(X[:, None, :] - X[None, :, :]).sum(-1)
    clusters = [[a] for a in range(A)]
    family: dict[int, np.ndarray] = {}

    def labels() -> np.ndarray:
        lab = np.zeros(A, dtype=np.int64)
        for i, c in enumerate(sorted(clusters, key=min)):
            lab[c] = i
        return lab

    family[A] = labels()
    while len(clusters) > 1:
        best, pair = math.inf, (0, 1)
        for i in range(len(clusters)):
            for j in range(i + 1, len(clusters)):
                d = D[np.ix_(clusters[i], clusters[j])].mean()
                if d < best - 1e-12:
                    best, pair = d, (i, j)
        i, j = pair
        clusters[i] = clusters[i] + clusters[j]
        del clusters[j]
        family[len(clusters)] = labels()
    return [family[k] for k in range(1, A + 1)]


def sample_model(mdp: GroupedMDP, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n >= 2`` generative-model samples of every ``(s, a)``, kept as two halves (``n // 2`` and the rest) so
    the bound can cross-fit: next-state counts ``[2, S, A, S]`` and reward sums ``[2, S, A]`` (rewards observed
    as ``R(s, a) + N(0, reward_noise^2)``). The plan uses both halves summed."""
    if n < 2:
        raise ValueError(f"n (samples per (s, a)) must be >= 2 to split the samples in two halves, got {n}")
    S, A, _ = mdp.P.shape
    counts = np.zeros((2, S, A, S))
    rsum = np.zeros((2, S, A))
    for half, m in enumerate((n // 2, n - n // 2)):
        for s in range(S):
            for a in range(A):
                counts[half, s, a] = rng.multinomial(m, mdp.P[s, a])
        rsum[half] = m * mdp.R + rng.normal(0.0, mdp.reward_noise * math.sqrt(m), size=mdp.R.shape)
    return counts, rsum


def grouped_estimate(counts: np.ndarray, rsum: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The grouped model: a group's actions treated as one, their samples pooled::

        P_g(s'|s) = sum_{a in g} N(s, a, s') / sum_{a in g} N(s, a),   R_g(s) = sum_{a in g} Rsum(s, a) / ...

    Returns ``(P_g[S, k, S], R_g[S, k])``."""
    S, A, _ = counts.shape
    k = int(labels.max()) + 1
    onehot = np.eye(k)[labels]                          # [A, k]
    c = np.einsum("sat,ag->sgt", counts, onehot)
    r = rsum @ onehot
    n = c.sum(-1)
    return c / n[..., None], r / n


def decomposition_offsets(counts: np.ndarray, rsum: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The linear decomposition's per-action reward correction ``b_a`` (one number per action).

    Model: ``R(s, a) = R_g(s) + b_a`` for ``a`` in group ``g``; ``b_a`` is estimated from every state's samples
    at once, ``b_a = mean_s (Rhat(s, a) - R_g(s))``, so it costs ``S`` times fewer samples per parameter than
    the per-(s, a) model it corrects."""
    n = counts.sum(-1)
    _, Rg = grouped_estimate(counts, rsum, labels)
    return (rsum / n - Rg[:, labels]).mean(0)


def decomposition_transition_offsets(counts: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The linear decomposition's per-action transition correction ``Delta_a(s')`` (one vector per action).

    Model: ``P(s'|s, a) = P_g(s'|s) + Delta_a(s')`` for ``a`` in group ``g``, with ``Delta_a`` shared by all
    states; least squares over the states gives ``Delta_a = mean_s (Phat(.|s, a) - P_g(.|s))`` (each row sums
    to 0, so ``P_g + Delta_a`` sums to 1; it can leave the simplex, see :func:`project_simplex`). A singleton
    group has ``Delta_a = 0``. Returns ``[A, S]``."""
    n = counts.sum(-1)
    Pg, _ = grouped_estimate(counts, np.zeros(counts.shape[:2]), labels)
    return (counts / n[..., None] - Pg[:, labels]).mean(0)


def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection of each row (last axis) onto the probability simplex: ``max(v - theta, 0)`` with
    ``theta`` the threshold that makes the row sum to 1 (the sort-based algorithm of Held, Wolfe and Crowder
    1974 / Duchi et al. 2008)."""
    u = -np.sort(-v, axis=-1)
    css = np.cumsum(u, axis=-1) - 1.0
    idx = np.arange(1, v.shape[-1] + 1)
    rho = ((u - css / idx) > 0).sum(-1, keepdims=True)                 # number of positive coordinates
    theta = np.take_along_axis(css, rho - 1, axis=-1) / rho
    return np.maximum(v - theta, 0.0)


def decomposed_model(counts: np.ndarray, rsum: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The grouped model corrected by the whole linear decomposition, one model per action::

        Ptilde(.|s, a) = Proj_simplex(P_g(.|s) + Delta_a),    Rtilde(s, a) = R_g(s) + b_a

    (:func:`decomposition_transition_offsets`, :func:`decomposition_offsets`). Its parameters are ``k`` group
    models (``S k (S + 1)``) plus ``A (S + 1)`` offsets instead of ``S A (S + 1)``: each offset is estimated from
    the samples of all ``S`` states. Returns ``(P[S, A, S], R[S, A])``."""
    Pg, Rg = grouped_estimate(counts, rsum, labels)
    P = project_simplex(Pg[:, labels] + decomposition_transition_offsets(counts, labels)[None])
    R = Rg[:, labels] + decomposition_offsets(counts, rsum, labels)[None]
    return P, R


def grouped_policy(counts: np.ndarray, rsum: np.ndarray, labels: np.ndarray, gamma: float,
                   correction: bool = False, decomposition: str | None = None) -> np.ndarray:
    """Plan on the grouped model, then act in the real MDP: ``pi[s, a]`` (stochastic).

    ``decomposition`` (``correction`` is the older name of ``"reward"``):

    - ``"none"`` — the grouped MDP (states ``S``, actions = the ``k`` groups) is solved by value iteration; in
      state ``s`` the policy plays the chosen group ``g*(s)``'s actions uniformly;
    - ``"reward"`` — the same plan, then the member of ``g*(s)`` with the largest reward offset ``b_a``
      (:func:`decomposition_offsets`);
    - ``"full"`` — value iteration on the decomposed per-action model (:func:`decomposed_model`: transition and
      reward offsets) and its greedy deterministic policy."""
    decomposition = decomposition or ("reward" if correction else "none")
    if decomposition not in ("none", "reward", "full"):
        raise ValueError(f"decomposition must be 'none', 'reward' or 'full', got {decomposition!r}")
    S, A, _ = counts.shape
    if decomposition == "full":
        P, R = decomposed_model(counts, rsum, labels)
        return np.eye(A)[discounted_q(P, R, gamma).argmax(1)]
    correction = decomposition == "reward"
    Pg, Rg = grouped_estimate(counts, rsum, labels)
    g_star = discounted_q(Pg, Rg, gamma).argmax(1)
    pi = np.zeros((S, A))
    b = decomposition_offsets(counts, rsum, labels) if correction else None
    for s in range(S):
        members = np.flatnonzero(labels == g_star[s])
        if b is None:
            pi[s, members] = 1.0 / len(members)
        else:
            pi[s, members[np.argmax(b[members])]] = 1.0
    return pi


def value_loss(mdp: GroupedMDP, pi: np.ndarray) -> float:
    """``mean_s (V*(s) - V^pi(s))``: the performance loss of ``pi`` from a uniform start state."""
    v_star = discounted_q(mdp.P, mdp.R, mdp.gamma).max(1)
    return float((v_star - discounted_value(mdp.P, mdp.R, mdp.gamma, pi)).mean())


def grouping_bound(counts: np.ndarray, rsum: np.ndarray, labels: np.ndarray, gamma: float,
                   reward_noise: float) -> dict:
    """Estimated (approximation + estimation) bound on the value loss of the grouped plan (simulation lemma).

    For a model within ``eps_R`` (rewards) and ``eps_P`` (transition rows, L1) of the truth, planning loses at
    most ``2 (eps_R + gamma V_max eps_P) / (1 - gamma)`` with ``V_max = 1 / (1 - gamma)``. Each ``eps`` is the
    sum of an approximation and an estimation term, root-mean-square over ``(s, a)``, with L1 taken as
    ``sqrt(S)`` times L2 (Cauchy-Schwarz):

    - approximation — how far an action's own model lies from its group's, ``||P_a - P_g||^2`` and
      ``(R_a - R_g)^2``, estimated without bias by cross-fitting the two halves of the samples
      (:func:`sample_model`): ``<Phat1_a - Phat1_g, Phat2_a - Phat2_g>`` (independent noise, so the product has
      the squared difference as its mean), averaged and clipped at 0;
    - estimation — the error of the pooled estimate from ``m = n |g|`` samples: ``sigma / sqrt(m)`` and
      ``sqrt(S u_s / m)``, ``u_s = (1 - sum_s' Phat(s')^2) M / (M - 1)`` from all ``M`` samples of state ``s``
      pooled over actions.

    ``counts [2, S, A, S]`` and ``rsum [2, S, A]`` are the two halves. Returns the terms and ``bound``;
    :func:`select_grouping` takes the grouping that minimises it."""
    S, A, _ = counts.shape[1:]
    halves = []
    for c, r in zip(counts, rsum):
        n = c.sum(-1)
        Pg, Rg = grouped_estimate(c, r, labels)
        halves.append((c / n[..., None] - Pg[:, labels], r / n - Rg[:, labels]))
    (dp1, dr1), (dp2, dr2) = halves
    approx_r = math.sqrt(max(0.0, float((dr1 * dr2).mean())))
    approx_p = math.sqrt(S * max(0.0, float((dp1 * dp2).sum(-1).mean())))
    total = counts.sum(0)
    n = total.sum(-1)                                    # [S, A]
    m = n * np.bincount(labels)[labels][None, :]
    M = n.sum(1, keepdims=True)                          # [S, 1]
    u = (1.0 - ((total.sum(1) / M) ** 2).sum(-1, keepdims=True)) * M / np.maximum(M - 1, 1)
    est_r = math.sqrt(float((reward_noise ** 2 / m).mean()))
    est_p = math.sqrt(S * float((u / m).mean()))
    vmax = 1.0 / (1.0 - gamma)
    scale = 2.0 / (1.0 - gamma)
    approx = scale * (approx_r + gamma * vmax * approx_p)
    est = scale * (est_r + gamma * vmax * est_p)
    return {"approximation": approx, "estimation": est, "bound": approx + est}


def decomposed_bound(counts: np.ndarray, rsum: np.ndarray, labels: np.ndarray, gamma: float,
                     reward_noise: float) -> dict:
    """:func:`grouping_bound` for the decomposed model (:func:`decomposed_model`), same simulation lemma.

    - approximation — what the decomposition leaves, ``P_a(.|s) - P_g(.|s) - Delta_a`` and
      ``R_a(s) - R_g(s) - b_a``, cross-fitted between the two halves (each half fits its own offsets);
    - estimation — the group part as in :func:`grouping_bound` plus the offsets': ``Delta_a`` averages over the
      ``S`` states ``Phat_a - Phat_g``, whose variance is ``u (1 - 1/|g|) / n`` (``Phat_g`` is the mean of the
      ``|g|`` members), so its error is ``sqrt(S u (1 - 1/|g|) / (n S))`` in L1 (0 for a singleton); likewise
      ``sigma sqrt((1 - 1/|g|) / (n S))`` for ``b_a``.

    ``counts [2, S, A, S]``, ``rsum [2, S, A]``. Returns the terms and ``bound``."""
    S, A, _ = counts.shape[1:]
    halves = []
    for c, r in zip(counts, rsum):
        n = c.sum(-1)
        Pg, Rg = grouped_estimate(c, r, labels)
        dp = c / n[..., None] - Pg[:, labels] - decomposition_transition_offsets(c, labels)[None]
        dr = r / n - Rg[:, labels] - decomposition_offsets(c, r, labels)[None]
        halves.append((dp, dr))
    (dp1, dr1), (dp2, dr2) = halves
    approx_r = math.sqrt(max(0.0, float((dr1 * dr2).mean())))
    approx_p = math.sqrt(S * max(0.0, float((dp1 * dp2).sum(-1).mean())))
    total = counts.sum(0)
    n = total.sum(-1)                                    # [S, A]
    size = np.bincount(labels)[labels][None, :]          # |g(a)|
    m = n * size
    M = n.sum(1, keepdims=True)
    u = (1.0 - ((total.sum(1) / M) ** 2).sum(-1, keepdims=True)) * M / np.maximum(M - 1, 1)
    shrink = 1.0 - 1.0 / size
    est_r = math.sqrt(float((reward_noise ** 2 / m).mean())) + \
        math.sqrt(float((reward_noise ** 2 * shrink / (n * S)).mean()))
    est_p = math.sqrt(S * float((u / m).mean())) + math.sqrt(float((u * shrink / n).mean()))
    vmax = 1.0 / (1.0 - gamma)
    scale = 2.0 / (1.0 - gamma)
    approx = scale * (approx_r + gamma * vmax * approx_p)
    est = scale * (est_r + gamma * vmax * est_p)
    return {"approximation": approx, "estimation": est, "bound": approx + est}


def select_grouping(counts: np.ndarray, rsum: np.ndarray, family: list[np.ndarray], gamma: float,
                    reward_noise: float, decomposition: str = "none") -> int:
    """The index of the grouping in ``family`` with the smallest estimated bound: :func:`decomposed_bound` when
    the plan uses the full decomposition (``decomposition="full"``), :func:`grouping_bound` otherwise."""
    bound = decomposed_bound if decomposition == "full" else grouping_bound
    bounds = [bound(counts, rsum, lab, gamma, reward_noise)["bound"] for lab in family]
    return int(np.argmin(bounds))


def grouping_experiment(*, seed: int = 0, sample_sizes: tuple[int, ...] = (2, 4, 8, 16, 64, 256, 1024),
                        ks: tuple[int, ...] | None = None, reps: int = 20, correction: bool = False,
                        mdp: GroupedMDP | None = None, decomposition: str | None = None) -> list[dict]:
    """Value loss of planning on each candidate grouping, and on the bound-selected one, per sample size ``n``.

    One MDP (``action_similar_mdp(seed=seed)`` unless given); the candidates are the groupings of
    :func:`grouping_family` of the true model with ``k`` groups for ``k`` in ``ks`` (default: the levels of the
    latent hierarchy, 1 .. A; the similarity structure is taken as known, the paper's grouping function, and only
    the models are estimated). For each ``n`` (samples per ``(s, a)``), ``reps`` independent sample sets. Returns
    one row per ``n``: ``loss_k<k>`` (mean value loss of the plan on grouping ``k``), ``loss_selected`` (of the
    grouping :func:`select_grouping` picks from the same samples), ``selected_k`` (mean ``k`` picked) and
    ``best_k`` (the ``k`` of least mean loss). ``decomposition`` (``"none"``, ``"reward"`` = ``correction``,
    ``"full"``) is the plan of :func:`grouped_policy`; with ``"full"`` the selection uses
    :func:`decomposed_bound`.

    Paper: Li, Ju and Shroff, "Achieving Sample and Computational Efficient Reinforcement Learning by Action
    Space Reduction via Grouping", arXiv:2306.12981 (seed 000-80).

    Provenance: reconstructed from the abstract — the hierarchical generator, clustering of the actions'
    transition and reward profiles (average linkage, L1), pooling a group's samples, the linear decomposition
    as a group model plus state-independent per-action offsets of the transition row and the reward
    (:func:`decomposition_transition_offsets`, :func:`decomposition_offsets`, :func:`decomposed_model`, the
    transition part projected onto the simplex) and the simulation-lemma bounds with cross-fitted
    approximation terms (:func:`grouping_bound`, :func:`decomposed_bound`), minimised over a nested family of
    candidate groupings (:func:`select_grouping`), are grpolab's choices. The paper's text past its abstract
    and introduction could not be read here (the stored copies hold the abstract and the opening of the
    introduction), so its own decomposition model, bound and action-space-independent selection method are
    not reproduced; no authors' code found (GitHub code and the web searched for the title and arXiv id;
    Papers with Code lists no implementation).
    """
    mdp = mdp or action_similar_mdp(seed=seed)
    family = grouping_family(mdp.P, mdp.R)
    A = mdp.R.shape[1]
    ks = ks or tuple(sorted({1, A, *[int(np.prod(mdp.branching[:i + 1])) for i in range(len(mdp.branching))]}))
    cands = [family[k - 1] for k in ks]
    rng = np.random.default_rng(10_000 + seed)
    rows = []
    for n in sample_sizes:
        losses = np.zeros((reps, len(ks)))
        sel_loss, sel_k = np.zeros(reps), np.zeros(reps)
        for r in range(reps):
            halves = sample_model(mdp, n, rng)
            counts, rsum = halves[0].sum(0), halves[1].sum(0)
            for i, lab in enumerate(cands):
                losses[r, i] = value_loss(mdp, grouped_policy(counts, rsum, lab, mdp.gamma, correction,
                                                              decomposition))
            j = select_grouping(*halves, cands, mdp.gamma, mdp.reward_noise,
                                decomposition or ("reward" if correction else "none"))
            sel_loss[r], sel_k[r] = losses[r, j], ks[j]
        mean = losses.mean(0)
        rows.append({"n": n, **{f"loss_k{k}": float(mean[i]) for i, k in enumerate(ks)},
                     "loss_selected": float(sel_loss.mean()), "selected_k": float(sel_k.mean()),
                     "best_k": ks[int(np.argmin(mean))]})
    return rows


def grouping_decomposition_experiment(*, seed: int = 0, sample_sizes: tuple[int, ...] = (2, 4, 8, 16, 64, 256, 1024),
                                      reps: int = 20) -> list[dict]:
    """The three plans of :func:`grouped_policy` on an MDP whose within-group differences are the same in every
    state (``action_similar_mdp(seed=seed, state_independent_fine=True)``), the form the decomposition fits:
    per ``n``, the mean value loss of the plan on the 4 latent groups with no decomposition, with the reward
    offsets and with the full (transition + reward) decomposition, of the singletons (k = 16, where the three
    coincide), and of the full plan on the grouping :func:`decomposed_bound` selects among k = 1, 4, 16."""
    mdp = action_similar_mdp(seed=seed, state_independent_fine=True)
    rows = []
    for mode in ("none", "reward", "full"):
        for row in grouping_experiment(seed=seed, sample_sizes=sample_sizes, reps=reps, mdp=mdp, decomposition=mode):
            rows.append({"decomposition": mode, **row})
    return rows


# ============================================================ 000-111: low-switching policy optimisation
@dataclass
class EpisodicMDP:
    """A finite-horizon tabular MDP with Bernoulli rewards of mean ``R[s, a]`` and start state 0."""
    P: np.ndarray   # [S, A, S]
    R: np.ndarray   # [S, A] in [0, 1]
    H: int


def random_episodic_mdp(n_states: int = 4, n_actions: int = 3, horizon: int = 4, seed: int = 0) -> EpisodicMDP:
    """A random episodic MDP: sparse-ish transitions ``Dirichlet(0.3)``, reward means ``U(0,1)^2`` (a few good
    actions stand out)."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(n_states, 0.3), size=(n_states, n_actions))
    R = rng.uniform(0, 1, size=(n_states, n_actions)) ** 2
    return EpisodicMDP(P=P, R=R, H=horizon)


def run_episode(mdp: EpisodicMDP, pi: np.ndarray, rng: np.random.Generator) -> list[tuple[int, int, int, float, int]]:
    """One episode of ``pi[h, s, a]`` from state 0: ``[(h, s, a, r, s'), ...]``."""
    s, out = 0, []
    S, A = mdp.R.shape
    for h in range(mdp.H):
        a = int(rng.choice(A, p=pi[h, s]))
        r = float(rng.random() < mdp.R[s, a])
        s2 = int(rng.choice(S, p=mdp.P[s, a]))
        out.append((h, s, a, r, s2))
        s = s2
    return out


def policy_return(mdp: EpisodicMDP, pi: np.ndarray) -> float:
    """Exact expected return of ``pi[h, s, a]`` from state 0."""
    _, V = episodic_q(mdp.P, mdp.R, mdp.H, pi=pi)
    return float(V[0, 0])


def optimal_return(mdp: EpisodicMDP) -> float:
    """``V*_0(0)`` by backward induction."""
    _, V = episodic_q(mdp.P, mdp.R, mdp.H)
    return float(V[0, 0])


def optimistic_npg(counts: np.ndarray, rsum: np.ndarray, logits: np.ndarray, H: int, *, bonus_scale: float,
                   lr: float, iters: int) -> np.ndarray:
    """Policy optimisation on the optimistic empirical model: ``iters`` natural-policy-gradient steps.

    Model from the counts ``N(h, s, a, s')`` pooled over ``h`` (the MDP is stationary):
    ``Phat = N(s,a,.) / N(s,a)`` (uniform where unvisited), ``Rhat = Rsum / N``, bonus ``c / sqrt(max(1, N))``.
    Each step evaluates the softmax policy ``pi_h(a|s) = softmax(logits[h, s])`` on the optimistic model and
    moves ``logits += lr * Q_opt^pi`` (for the softmax class, the NPG step is this multiplicative-weights update).
    Returns the new logits."""
    S, A, _ = counts.shape
    n = counts.sum(-1)
    P = np.where(n[..., None] > 0, counts / np.maximum(n, 1)[..., None], 1.0 / S)
    R = np.where(n > 0, rsum / np.maximum(n, 1), 1.0)
    bonus = np.broadcast_to(bonus_scale / np.sqrt(np.maximum(n, 1)), (H, S, A))
    logits = logits.copy()
    for _ in range(iters):
        pi = softmax(logits)
        Q, _ = episodic_q(P, R, H, pi=pi, bonus=bonus)
        logits += lr * Q
        logits -= logits.max(-1, keepdims=True)
    return logits


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def train_lpo(mdp: EpisodicMDP, episodes: int, *, switching: str = "sensitivity", seed: int = 0,
              bonus_scale: float = 1.0, lr: float = 1.0, npg_iters: int = 10, eval_every: int = 0) -> dict:
    """Low-switching policy optimisation on a tabular episodic MDP; returns its metrics.

    Features are tabular, ``phi(s, a) = e_{(s,a)}`` (``d = S A``), so the covariance
    ``Lambda = I + sum_t phi_t phi_t^T`` is diagonal, ``1 + N(s, a)``. A sample's online sensitivity (its
    leverage) is ``phi^T Lambda^-1 phi = 1 / (1 + N(s, a))``, and adding it multiplies ``det Lambda`` by
    ``1 + sensitivity``. With ``switching="sensitivity"`` the behaviour policy is replaced, after an episode, only
    when the accumulated ``sum log(1 + sensitivity)`` since the last switch reaches ``log 2`` — the determinant
    of ``Lambda`` has doubled — so the number of switches is at most ``log2 det Lambda_T <= d log2(1 + T H / d)``.
    At a switch: :func:`optimistic_npg` on all data so far, warm-started from the deployed policy. With
    ``switching="every"`` the same update runs after every episode (the baseline).

    Returns ``{"switches", "returns" (exact return of the deployed policy before the first episode and at each
    eval point), "eval_episodes", "final_return", "optimal_return", "d", "logdet"}``.

    Paper: Li, Wang, Cheng and Yang, "Low-Switching Policy Gradient with Exploration via Online Sensitivity
    Sampling", ICML 2023, arXiv:2306.09554 (seed 000-111).

    Provenance: reconstructed from the abstract — tabular features so the eluder-dimension/sensitivity machinery
    reduces to counts, the log 2 (determinant-doubling) switching threshold, the optimistic empirical model with
    a 1/sqrt(N) bonus and softmax natural-policy-gradient steps are grpolab's choices. The general
    function-class version (a kernel class, sensitivity-sampled sub-dataset) is :func:`train_lpo_kernel`; the
    paper's confidence sets and step sizes are not reproduced (no authors' code found: Papers with Code lists
    none; GitHub code search for the title found none).
    """
    if switching not in ("sensitivity", "every"):
        raise ValueError(f"switching must be 'sensitivity' or 'every', got {switching!r}")
    S, A = mdp.R.shape
    counts = np.zeros((S, A, S))
    rsum = np.zeros((S, A))

    def observe(s, a, r, s2) -> float:
        gain = math.log1p(1.0 / (1.0 + counts[s, a].sum()))   # log(1 + phi^T Lambda^-1 phi)
        counts[s, a, s2] += 1
        rsum[s, a] += r
        return gain

    def update(logits):
        return optimistic_npg(counts, rsum, logits, mdp.H, bonus_scale=bonus_scale, lr=lr, iters=npg_iters)

    switches, returns, at, logdet = low_switching_loop(mdp, episodes, np.random.default_rng(seed), observe, update,
                                                       eval_every=eval_every, every=switching == "every")
    return {"switches": switches, "returns": returns, "eval_episodes": at, "final_return": returns[-1],
            "optimal_return": optimal_return(mdp), "d": S * A, "logdet": logdet}


def low_switching_loop(mdp: EpisodicMDP, episodes: int, rng: np.random.Generator, observe, update, *,
                       eval_every: int = 0, every: bool = False) -> tuple[int, list[float], list[int], float]:
    """The episode loop of :func:`train_lpo` and :func:`train_lpo_kernel`: ``episodes`` episodes of the deployed
    policy (the softmax of the logits, zero at first); each sample ``(s, a, r, s')`` goes to ``observe``, which
    returns its increase of ``log det Lambda``; after an episode, when the accumulated increase since the last
    switch reaches ``log 2`` (or after every episode with ``every``), the logits become ``update(logits)`` and
    their softmax is deployed. The deployed policy's exact return is taken before the first episode and every
    ``eval_every`` episodes (0: ``episodes // 20``) and after the last. Returns ``(switches, returns,
    eval_episodes, logdet)``."""
    S, A = mdp.R.shape
    logits = np.zeros((mdp.H, S, A))
    deployed = softmax(logits)
    logdet = logdet_at_switch = 0.0
    switches = 0
    returns, at = [policy_return(mdp, deployed)], [0]
    eval_every = eval_every or max(1, episodes // 20)
    for t in range(episodes):
        for h, s, a, r, s2 in run_episode(mdp, deployed, rng):
            logdet += observe(s, a, r, s2)
        if every or logdet - logdet_at_switch >= math.log(2.0):
            logits = update(logits)
            deployed = softmax(logits)
            logdet_at_switch = logdet
            switches += 1
        if (t + 1) % eval_every == 0 or t + 1 == episodes:
            returns.append(policy_return(mdp, deployed))
            at.append(t + 1)
    return switches, returns, at, logdet


def lpo_switch_bound(d: int, steps: int) -> float:
    """The determinant-doubling bound on the number of switches: ``log2 det Lambda_T <= d log2(1 + steps / d)``
    (AM-GM on the eigenvalues of ``I + sum phi phi^T`` with ``||phi|| = 1`` and ``steps`` samples)."""
    return d * math.log2(1.0 + steps / d)


def lpo_experiment(*, seed: int = 0, horizons: tuple[int, ...] = (250, 500, 1000, 2000),
                   mdp: EpisodicMDP | None = None) -> list[dict]:
    """LPO against every-episode switching at several numbers of episodes ``T``: switches, the bound
    ``d log2(1 + T H / d)`` and the final suboptimality ``V* - V^pi`` of each."""
    mdp = mdp or random_episodic_mdp(seed=seed)
    rows = []
    for T in horizons:
        low = train_lpo(mdp, T, switching="sensitivity", seed=seed)
        every = train_lpo(mdp, T, switching="every", seed=seed)
        rows.append({"T": T, "switches": low["switches"], "switch_bound": lpo_switch_bound(low["d"], T * mdp.H),
                     "every_switches": every["switches"], "optimal": low["optimal_return"],
                     "gap_lpo": low["optimal_return"] - low["final_return"],
                     "gap_every": every["optimal_return"] - every["final_return"],
                     "initial_return": low["returns"][0]})
    return rows


# ------------------------------------------------------------ LPO with a kernel function class
def smooth_chain_mdp(n_states: int = 20, horizon: int = 16, width: float = 0.1, seed: int = 0) -> EpisodicMDP:
    """A chain whose reward is a smooth function of the position, the setting where a kernel class generalises.

    States ``s = 0..S-1`` at positions ``x_s = s / (S - 1)``, start state 0; actions left / stay / right move
    one step with probability 0.9 (else stay; clipped at the ends); the reward mean is a bump
    ``0.9 exp(-(x_s - c)^2 / (2 width^2))`` around ``c ~ U(0.6, 0.95)`` plus ``0.05 U(0, 1)`` per ``(s, a)``
    (Bernoulli rewards, as :class:`EpisodicMDP`)."""
    rng = np.random.default_rng(seed)
    S, A = n_states, 3
    P = np.zeros((S, A, S))
    for s in range(S):
        for a, move in enumerate((-1, 0, 1)):
            t = min(max(s + move, 0), S - 1)
            P[s, a, t] += 0.9
            P[s, a, s] += 0.1
    x = np.arange(S) / (S - 1)
    c = rng.uniform(0.6, 0.95)
    R = 0.9 * np.exp(-(x - c) ** 2 / (2 * width ** 2))[:, None] + 0.05 * rng.uniform(0, 1, size=(S, A))
    return EpisodicMDP(P=P, R=np.clip(R, 0.0, 1.0), H=horizon)


def chain_kernel(n_states: int, n_actions: int, lengthscale: float = 0.25) -> np.ndarray:
    """The kernel of the function class on ``z = (s, a)`` (index ``s * A + a``): an RBF in the position times
    the action's indicator, ``k(z, z') = exp(-(x_s - x_s')^2 / (2 l^2)) 1[a = a']``. ``[S A, S A]``."""
    x = np.arange(n_states) / max(n_states - 1, 1)
    ks = np.exp(-(x[:, None] - x[None, :]) ** 2 / (2 * lengthscale ** 2))
    return np.kron(ks, np.eye(n_actions))


def kernel_width2(K: np.ndarray, weights: np.ndarray, lam: float) -> np.ndarray:
    """Squared width of the RKHS class on the (weighted) data at every point ``z`` of the domain::

        w^2(z) = sup { f(z)^2 : lam ||f||_H^2 + sum_i w_i f(z_i)^2 <= 1 } = phi(z)^T Lambda^-1 phi(z)
               = (k(z, z) - k_D(z)^T W^1/2 (W^1/2 K_D W^1/2 + lam I)^-1 W^1/2 k_D(z)) / lam

    with ``Lambda = lam I + sum_i w_i phi(z_i) phi(z_i)^T`` (the feature covariance; the last form is the kernel
    trick, Woodbury). ``weights[z]``: the data's total weight at each domain point (0 where none). With the
    one-hot kernel ``K = I`` it is ``1 / (lam + w_z)``, the tabular leverage. Returns ``[Z]``."""
    r = np.sqrt(np.maximum(weights, 0.0))
    M = r[:, None] * K * r[None, :] + lam * np.eye(len(K))
    B = r[:, None] * K                                    # W^1/2 k_D(z) for every z, columns
    return np.maximum(np.diag(K) - np.einsum("iz,iz->z", B, np.linalg.solve(M, B)), 0.0) / lam


def kernel_ridge(K: np.ndarray, counts: np.ndarray, means: np.ndarray, lam: float) -> np.ndarray:
    """Kernel ridge regression fitted on ``counts[z]`` targets of mean ``means[z]`` at each domain point,
    evaluated on the whole domain: ``f = K alpha``, ``alpha = (N K + lam I)^-1 N ybar`` (``N = diag(counts)``),
    the minimiser of ``sum_i (f(z_i) - y_i)^2 + lam ||f||_H^2``. One-hot kernel: ``n_z ybar_z / (n_z + lam)``."""
    N = np.diag(counts)
    return K @ np.linalg.solve(N @ K + lam * np.eye(len(K)), counts * means)


def kernel_optimistic_npg(K: np.ndarray, counts: np.ndarray, rsum: np.ndarray, width2: np.ndarray,
                          logits: np.ndarray, H: int, *, bonus_scale: float, lr: float, iters: int,
                          lam: float) -> np.ndarray:
    """:func:`optimistic_npg` with the kernel class in place of the empirical model: each step evaluates the
    softmax policy by optimistic least-squares policy evaluation,

        Q_h = min(H - h, f_h + beta w),   f_h = kernel ridge fit of the targets r + V_{h+1}(s') on all data,
        V_h(s) = sum_a pi_h(a|s) Q_h(s, a),

    (the targets aggregated per ``(s, a)``: ``ybar = Rsum / N + Phat V_{h+1}``), ``w`` the class's width on the
    sensitivity-sampled sub-dataset (:func:`kernel_width2`), then ``logits_h += lr Q_h``."""
    S, A, _ = counts.shape
    n = counts.sum(-1).reshape(-1)
    Phat = (counts / np.maximum(counts.sum(-1), 1)[..., None]).reshape(S * A, S)
    rbar = (rsum / np.maximum(counts.sum(-1), 1)).reshape(-1)
    bonus = (bonus_scale * np.sqrt(width2)).reshape(S, A)
    logits = logits.copy()
    for _ in range(iters):
        pi = softmax(logits)
        V = np.zeros(S)
        for h in range(H - 1, -1, -1):
            f = kernel_ridge(K, n, rbar + Phat @ V, lam).reshape(S, A)
            Q = np.clip(f + bonus, 0.0, H - h)
            V = (pi[h] * Q).sum(1)
            logits[h] += lr * Q
        logits -= logits.max(-1, keepdims=True)
    return logits


def train_lpo_kernel(mdp: EpisodicMDP, episodes: int, K: np.ndarray, *, seed: int = 0, lam: float = 1.0,
                     oversample: float = 1.0, bonus_scale: float = 1.0, lr: float = 1.0, npg_iters: int = 10,
                     eval_every: int = 0) -> dict:
    """LPO with a general (kernel) function class and online sensitivity sampling; returns its metrics.

    Each new sample ``z = (s, a)`` has online sensitivity ``sens(z) = min(1, w^2(z))``, the class's squared
    width at ``z`` on the sub-dataset kept so far (:func:`kernel_width2`); it enters the sub-dataset with
    probability ``p = min(1, oversample * sens)`` and weight ``1 / p`` (so the sub-dataset's weighted covariance
    estimates the full data's). A kept sample multiplies ``det Lambda`` of the sub-dataset by
    ``1 + w^2(z) / p``; the behaviour policy is replaced only when that determinant has doubled since the last
    switch (accumulated ``log(1 + w^2 / p) >= log 2``). At a switch: :func:`kernel_optimistic_npg` on all data
    (regression) with the sub-dataset's width as the bonus, warm-started from the deployed policy. With the
    one-hot kernel, ``oversample = 1`` and ``lam = 1`` the sensitivities are :func:`train_lpo`'s
    ``1 / (1 + N(s, a))``.

    Returns ``{"switches", "kept" (sub-dataset size), "samples", "returns", "eval_episodes", "final_return",
    "optimal_return", "logdet"}``.

    Paper: Li, Wang, Cheng and Yang, "Low-Switching Policy Gradient with Exploration via Online Sensitivity
    Sampling", ICML 2023, arXiv:2306.09554 (seed 000-111).

    Provenance: reconstructed from the abstract and the paper's introduction (the stored text stops there) —
    the RKHS ball as the general function class (its width on the data has the closed form above, so the
    sensitivity is exact rather than estimated by an oracle), sampling probability ``min(1, c sens)`` with
    weight ``1 / p``, the determinant-doubling switch on the sub-dataset, optimistic least-squares policy
    evaluation with the width as the bonus and softmax NPG steps are grpolab's choices; the paper's confidence
    set radii, its policy cover over epochs and its step sizes are not reproduced (no authors' code found).
    """
    rng = np.random.default_rng(seed)
    S, A = mdp.R.shape
    counts = np.zeros((S, A, S))
    rsum = np.zeros((S, A))
    kept_w = np.zeros(S * A)
    width2 = kernel_width2(K, kept_w, lam)
    kept = samples = 0

    def observe(s, a, r, s2) -> float:
        nonlocal width2, kept, samples
        z = s * A + a
        samples += 1
        counts[s, a, s2] += 1
        rsum[s, a] += r
        p = min(1.0, oversample * min(1.0, width2[z]))
        if rng.random() >= p:
            return 0.0
        gain = math.log1p(width2[z] / p)          # det(Lambda + phi phi^T / p) / det(Lambda)
        kept_w[z] += 1.0 / p
        kept += 1
        width2 = kernel_width2(K, kept_w, lam)
        return gain

    def update(logits):
        return kernel_optimistic_npg(K, counts, rsum, width2, logits, mdp.H, bonus_scale=bonus_scale, lr=lr,
                                     iters=npg_iters, lam=lam)

    switches, returns, at, logdet = low_switching_loop(mdp, episodes, rng, observe, update, eval_every=eval_every)
    return {"switches": switches, "kept": kept, "samples": samples, "returns": returns, "eval_episodes": at,
            "final_return": returns[-1], "optimal_return": optimal_return(mdp), "logdet": logdet}


def lpo_kernel_experiment(*, seed: int = 0, horizons: tuple[int, ...] = (50, 100, 200, 400),
                          lengthscale: float = 0.25) -> list[dict]:
    """Kernel LPO against tabular LPO (:func:`train_lpo`) on :func:`smooth_chain_mdp` at several numbers of
    episodes ``T``: switches, the kernel run's sub-dataset size, and each one's final gap ``V* - V^pi``."""
    mdp = smooth_chain_mdp(seed=seed)
    S, A = mdp.R.shape
    K = chain_kernel(S, A, lengthscale)
    rows = []
    for T in horizons:
        kern = train_lpo_kernel(mdp, T, K, seed=seed)
        tab = train_lpo(mdp, T, switching="sensitivity", seed=seed)
        rows.append({"T": T, "kernel_switches": kern["switches"], "kernel_kept": kern["kept"],
                     "samples": kern["samples"], "tabular_switches": tab["switches"],
                     "gap_kernel": kern["optimal_return"] - kern["final_return"],
                     "gap_tabular": tab["optimal_return"] - tab["final_return"],
                     "optimal": kern["optimal_return"], "initial_return": kern["returns"][0]})
    return rows


# ============================================================ 000-105: agnostic policy learning
@dataclass
class AgnosticSetup:
    """An episodic MDP and a restricted policy class: deterministic policies that must take the same action in
    all states of a cell (``cells[s]``), stationary over ``h``. ``|Pi| = A ** n_cells``."""
    mdp: EpisodicMDP
    cells: np.ndarray   # [S] cell of each state


def agnostic_setup(n_states: int = 6, n_actions: int = 3, horizon: int = 3, n_cells: int = 3,
                   seed: int = 0) -> AgnosticSetup:
    """A random episodic MDP and a class that aliases states in pairs (``cells[s] = s mod n_cells``): the class
    cannot tell aliased states apart, so it misses the optimal policy whenever they want different actions."""
    return AgnosticSetup(mdp=random_episodic_mdp(n_states, n_actions, horizon, seed=seed),
                         cells=np.arange(n_states) % n_cells)


def class_policies(setup: AgnosticSetup) -> np.ndarray:
    """Every policy of the class as ``[|Pi|, S]`` state-to-action tables."""
    A = setup.mdp.R.shape[1]
    n_cells = int(setup.cells.max()) + 1
    grid = np.array(np.meshgrid(*[np.arange(A)] * n_cells, indexing="ij")).reshape(n_cells, -1).T
    return grid[:, setup.cells]


def table_policy(table: np.ndarray, A: int, H: int) -> np.ndarray:
    """A deterministic state-to-action table as ``pi[h, s, a]``."""
    return np.broadcast_to(np.eye(A)[table], (H, len(table), A)).copy()


def best_in_class(setup: AgnosticSetup) -> tuple[float, int]:
    """``max_{pi in Pi} V^pi`` by enumeration, and the index of the argmax."""
    A = setup.mdp.R.shape[1]
    values = [policy_return(setup.mdp, table_policy(t, A, setup.mdp.H)) for t in class_policies(setup)]
    return float(max(values)), int(np.argmax(values))


def sample_episodes(mdp: EpisodicMDP, pi: np.ndarray, episodes: int, rng: np.random.Generator):
    """``episodes`` episodes of the stationary policy ``pi[s, a]`` from state 0, simulated together: states and
    actions ``[N, H]`` and returns ``[N]``."""
    S, A = mdp.R.shape
    N, H = episodes, mdp.H
    states = np.zeros((N, H), dtype=np.int64)
    actions = np.zeros((N, H), dtype=np.int64)
    returns = np.zeros(N)
    cum_p = np.cumsum(mdp.P, axis=-1)
    cum_pi = np.cumsum(pi, axis=-1)
    s = np.zeros(N, dtype=np.int64)
    for h in range(H):
        states[:, h] = s
        a = np.minimum((rng.random(N)[:, None] > cum_pi[s]).sum(-1), A - 1)
        actions[:, h] = a
        returns += rng.random(N) < mdp.R[s, a]
        s = np.minimum((rng.random(N)[:, None] > cum_p[s, a]).sum(-1), S - 1)
    return states, actions, returns


def uniform_episodes(mdp: EpisodicMDP, episodes: int, rng: np.random.Generator):
    """:func:`sample_episodes` of the uniformly random policy."""
    S, A = mdp.R.shape
    return sample_episodes(mdp, np.full((S, A), 1.0 / A), episodes, rng)


def erm_importance_sampling(setup: AgnosticSetup, episodes: int, rng: np.random.Generator) -> int:
    """Empirical risk minimisation over the class from ``episodes`` uniformly exploring episodes.

    Every policy's value is estimated from the same data by importance weighting, ``Vhat(pi) = mean_i
    prod_h 1[pi(s_h) = a_h] A * G_i`` (``G_i`` the episode's return; under the uniform behaviour policy the weight
    is ``A^H`` when the episode followed ``pi`` and 0 otherwise), and the argmax is returned (ties: the first).
    Its error is of order ``sqrt(A^H log|Pi| / N)`` with no assumption on ``Pi`` or on the MDP's coverage: the
    exponential-in-``H`` price of agnostic learning from online access without coverage conditions."""
    mdp = setup.mdp
    A = mdp.R.shape[1]
    tables = class_policies(setup)                        # [|Pi|, S]
    states, actions, returns = uniform_episodes(mdp, episodes, rng)
    follows = (tables[:, states] == actions[None]).all(-1)   # [|Pi|, N]
    est = (follows * returns[None]).sum(1) * float(A ** mdp.H) / max(episodes, 1)
    return int(np.argmax(est))


def train_class_pg(setup: AgnosticSetup, episodes: int, *, group_size: int = 8, lr: float = 0.5,
                   seed: int = 0) -> np.ndarray:
    """Group-relative policy gradient inside the class's softmax relaxation; returns the final ``theta``.

    The policy is ``pi(a|s) = softmax(theta[cell(s)])`` (a log-linear class over the cell features, whose greedy
    policies are exactly the class's); each update draws ``group_size`` episodes from the start state, gives each
    the GRPO group z-score of its return (``group_zscore``, looked up in the ADVANTAGES registry: control/ does
    not import algorithms/, which imports control/), and ascends
    ``theta[cell(s_h)] += lr / G * sum_i A_i sum_h (e_{a_h} - pi(.|s_h))`` (the score function of the softmax).
    Learns from ``episodes`` episodes in all (``episodes // group_size`` updates)."""
    mdp = setup.mdp
    S, A = mdp.R.shape
    n_cells = int(setup.cells.max()) + 1
    rng = np.random.default_rng(30_000 + seed)
    theta = np.zeros((n_cells, A))
    gid = torch.zeros(group_size, dtype=torch.long)
    group_zscore = ADVANTAGES.get("group_zscore")
    for _ in range(episodes // group_size):
        pi = softmax(theta)[setup.cells]                               # [S, A]
        states, actions, returns = sample_episodes(mdp, pi, group_size, rng)
        adv = group_zscore(torch.as_tensor(returns), gid).numpy()      # [G]
        score = np.eye(A)[actions] - pi[states]                        # [G, H, A]
        grad = np.zeros_like(theta)
        np.add.at(grad, setup.cells[states], adv[:, None, None] * score)
        theta += lr * grad / group_size
    return theta


def agnostic_experiment(*, seed: int = 0, episode_counts: tuple[int, ...] = (10, 30, 100, 300, 1000, 3000, 10000),
                        reps: int = 50, pg_reps: int = 10, setup: AgnosticSetup | None = None) -> list[dict]:
    """Suboptimality against the best in class, ``V^{pi_best} - V^{pi_hat}``, as the number of episodes grows:
    ``subopt_vs_best_in_class`` for ERM (:func:`erm_importance_sampling`, mean over ``reps``) and ``subopt_pg``
    for the greedy policy of :func:`train_class_pg` (mean over ``pg_reps``), next to the class's approximation gap
    ``V* - V^{pi_best}`` (which no amount of data closes).

    Thesis: Gene Li, "Agnostic Reinforcement Learning: Foundations and Algorithms", arXiv:2506.01884 (seed
    000-105). Of its three axes this builds one point: environment access = online episodes from a fixed start
    state (collected by the uniform policy), no coverage condition assumed, and a representational restriction
    (state aliasing) that excludes the optimal policy; the learners are importance-weighted ERM over the class
    and group-relative policy gradient in its softmax relaxation.

    Provenance: reconstructed from the abstract — the aliased-state policy class, the exact best-in-class value by
    enumeration, the importance-sampling ERM learner and the policy-gradient learner are grpolab's choices
    illustrating the abstract's setting (no code accompanies the thesis). The thesis's generative-access
    algorithm under bounded spanning capacity is :func:`spanning_erm` (:func:`spanning_experiment` compares it
    with this online learner).
    """
    setup = setup or agnostic_setup(seed=seed)
    mdp = setup.mdp
    A = mdp.R.shape[1]
    tables = class_policies(setup)
    values = np.array([policy_return(mdp, table_policy(t, A, mdp.H)) for t in tables])
    v_best = float(values.max())
    v_star = optimal_return(mdp)
    rng = np.random.default_rng(20_000 + seed)
    index = {tuple(t): i for i, t in enumerate(tables)}
    rows = []
    for N in episode_counts:
        gaps = [v_best - values[erm_importance_sampling(setup, N, rng)] for _ in range(reps)]
        pg = [v_best - values[index[tuple(train_class_pg(setup, N, seed=1000 * seed + r).argmax(1)[setup.cells])]]
              for r in range(pg_reps)]
        rows.append({"episodes": N, "subopt_vs_best_in_class": float(np.mean(gaps)),
                     "subopt_pg": float(np.mean(pg)),
                     "approximation_gap": v_star - v_best, "class_size": len(tables), "v_best": v_best,
                     "v_star": v_star})
    return rows


def realisation_returns(setup: AgnosticSetup, rng: np.random.Generator,
                        tables: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """One sampled deterministic realisation of the MDP along the class's paths, and every policy's return in it.

    Layer by layer from the start state, each ``(h, s, a)`` that some policy of the class reaches is queried
    once from the generative model (``s' ~ P(.|s, a)``, ``r ~ Bernoulli(R(s, a))``) and the draw is shared by
    every policy through it: the realisation is a deterministic MDP, so the queries at layer ``h`` are the
    class's reachable pairs in it, at most the spanning capacity ``C(Pi)``. A policy visits one pair per layer,
    so its return here has the law of an episode's return: an unbiased estimate of ``V^pi`` for every policy
    at once. Returns ``(returns [|Pi|], queries)``."""
    mdp = setup.mdp
    S, A = mdp.R.shape
    tables = class_policies(setup) if tables is None else tables
    n = len(tables)
    state = np.zeros(n, dtype=np.int64)
    ret = np.zeros(n)
    queries = 0
    for h in range(mdp.H):
        action = tables[np.arange(n), state]
        pairs, inverse = np.unique(state * A + action, return_inverse=True)
        queries += len(pairs)
        s, a = pairs // A, pairs % A
        nxt = np.minimum((rng.random(len(pairs))[:, None] > np.cumsum(mdp.P[s, a], -1)).sum(-1), S - 1)
        rew = (rng.random(len(pairs)) < mdp.R[s, a]).astype(np.float64)
        ret += rew[inverse.reshape(-1)]
        state = nxt[inverse.reshape(-1)]
    return ret, queries


def spanning_erm(setup: AgnosticSetup, budget: int, rng: np.random.Generator) -> tuple[int, int]:
    """Agnostic policy learning with a generative model: ERM over the class on sampled realisations.

    Draw realisations (:func:`realisation_returns`) until the next one would exceed ``budget`` generative
    queries (at least one), average each policy's returns over them and return the argmax (ties: the first)
    and the queries spent. Each realisation costs at most ``H C(Pi)`` queries, and the averages are
    ``[0, H]``-bounded means, so ``n = O(H^2 log(|Pi| / delta) / eps^2)`` realisations give an ``eps``-best
    policy in the class: ``O(H^3 C(Pi) log|Pi| / eps^2)`` queries, with no dependence on the number of states
    or on ``A^H`` — the generative-access upper bound in terms of the spanning capacity.

    Thesis: Gene Li, "Agnostic Reinforcement Learning: Foundations and Algorithms", arXiv:2506.01884 (seed
    000-105); its generative-model result is from Gene Li, Zeyu Jia, Alexander Rakhlin, Ayush Sekhari and Nati
    Srebro, "When is Agnostic Reinforcement Learning Statistically Tractable?", NeurIPS 2023 (the spanning
    capacity: the most state-action pairs the class reaches at one layer of any deterministic MDP).

    Provenance: reconstructed from the abstracts of the thesis and of the NeurIPS paper (the stored copies hold
    no more): that bounded spanning capacity makes agnostic learning tractable with a generative model is their
    statement; the estimator (lazily sampled realisations shared by the class, in the manner of Kearns, Mansour
    and Ng's trajectory trees) and the query accounting are grpolab's reconstruction of such an algorithm, not
    the thesis's pseudocode; POPLER (online access with the sunflower property), the policy-emulator algorithm
    for Block MDPs with resets, and the lower bounds (including PSDP's and CPI's failure without policy
    completeness) are not built."""
    tables = class_policies(setup)
    total = np.zeros(len(tables))
    spent = 0
    n = 0
    while True:
        ret, q = realisation_returns(setup, rng, tables)
        if n and spent + q > budget:
            break
        total += ret
        spent += q
        n += 1
    return int(np.argmax(total)), spent


def spanning_experiment(*, seed: int = 0, budgets: tuple[int, ...] = (30, 100, 300, 1000, 3000, 10000, 30000),
                    horizon: int = 6, reps: int = 50) -> list[dict]:
    """Generative-model ERM on realisations (:func:`spanning_erm`) against online importance-sampling ERM
    (:func:`erm_importance_sampling`) at the same sample budget (generative queries, resp. ``episodes x H``
    environment steps), on :func:`agnostic_setup` with a longer horizon (importance weights ``A^H``):
    suboptimality against the best in class (mean over ``reps``), and the queries one realisation costs."""
    setup = agnostic_setup(horizon=horizon, seed=seed)
    mdp = setup.mdp
    A = mdp.R.shape[1]
    tables = class_policies(setup)
    values = np.array([policy_return(mdp, table_policy(t, A, mdp.H)) for t in tables])
    v_best = float(values.max())
    rng = np.random.default_rng(40_000 + seed)
    per_tree = np.mean([realisation_returns(setup, rng, tables)[1] for _ in range(200)])
    rows = []
    for B in budgets:
        tree = [v_best - values[spanning_erm(setup, B, rng)[0]] for _ in range(reps)]
        erm = [v_best - values[erm_importance_sampling(setup, max(1, B // mdp.H), rng)] for _ in range(reps)]
        rows.append({"budget": B, "subopt_generative_erm": float(np.mean(tree)),
                     "subopt_online_is_erm": float(np.mean(erm)), "queries_per_realisation": float(per_tree),
                     "H": mdp.H, "A_pow_H": A ** mdp.H, "class_size": len(tables), "v_best": v_best,
                     "approximation_gap": optimal_return(mdp) - v_best})
    return rows


# ============================================================ command line
def _print_table(rows: list[dict]) -> None:
    keys = list(rows[0])
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in keys))


def main(argv: list[str] | None = None) -> int:
    """``python -m grpolab.experiments.theory <name|all> [seed]``: print the measured tables."""
    argv = sys.argv[1:] if argv is None else argv
    which = argv[0] if argv else "all"
    seed = int(argv[1]) if len(argv) > 1 else 0
    runs = {"grouping": lambda: grouping_experiment(seed=seed),
            "grouping_corrected": lambda: grouping_experiment(seed=seed, correction=True),
            "grouping_decomposed": lambda: grouping_decomposition_experiment(seed=seed),
            "lpo": lambda: lpo_experiment(seed=seed), "lpo_kernel": lambda: lpo_kernel_experiment(seed=seed),
            "agnostic": lambda: agnostic_experiment(seed=seed),
            "spanning": lambda: spanning_experiment(seed=seed)}
    if which != "all" and which not in runs:
        print(f"unknown experiment {which!r}; valid: {', '.join(runs)}, all", file=sys.stderr)
        return 2
    for name, fn in runs.items():
        if which in ("all", name):
            print(f"## {name} (seed {seed})")
            _print_table(fn())
            print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
