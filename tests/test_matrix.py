"""Every recipe under every distribution policy, on 4 of the forced CPU devices: it
compiles and runs a few iterations, and where the policy claims exactness the whole
training state (parameters, optimizer state, replay buffer, environments) equals the
SingleDevice run's. The rows of the environment families run under the policies ``UNDER``
names for them."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import jaxrl_frag as jf
from jaxrl_frag.sharding import ActorLearner, DataParallel, PopulationParallel, SingleDevice
from jaxrl_frag.transforms import Population

ON_POLICY = dict(num_envs=8, num_steps=16, total_steps=8 * 16 * 4, num_minibatches=2)  # 4 iterations
OFF_POLICY = dict(num_envs=8, num_steps=4, total_steps=8 * 4 * 4, num_updates=2, minibatch_size=32, buffer_size=256,
                  learning_starts=64)  # 4 iterations, gradient steps from the second on
# two epochs, not the recipes' four: the second still reshuffles whole environments, and the programs, which run slowly
# as the suite compiles them (XLA's cheaper optimizations, 4 devices on 2 cores), take half as long to run
RECURRENT = {**ON_POLICY, "memory": "gru", "num_epochs": 2}
MULTI_AGENT = "jaxmarl:switch_riddle"
SMALL = {
    "ppo": ("CartPole-v1", ON_POLICY),
    "a2c": ("CartPole-v1", ON_POLICY),
    "impala": ("CartPole-v1", ON_POLICY),
    "dqn": ("CartPole-v1", {**OFF_POLICY, "n_step": 3, "prioritized": True}),
    # noisy layers (their noise drawn from replicated keys: the same on every device) and a dueling head of 8 quantiles
    "qrdqn": ("CartPole-v1", {**OFF_POLICY, "n_step": 3, "prioritized": True, "noisy": True, "quantiles": 8,
                              "hidden": (32, 32)}),
    "sac": ("Pendulum-v1", {**OFF_POLICY, "hidden": (32, 32)}),
    # random actions for the first 64 steps; one actor (and target) update per iteration of 2 critic updates
    "td3": ("Pendulum-v1", {**OFF_POLICY, "hidden": (32, 32)}),
    # the multi-agent recipes on JaxMARL's quickest environment to compile (masks, padding and SMAX's global state
    # are test_multi_agent.py's)
    "ippo": (MULTI_AGENT, {**ON_POLICY, "shared_params": False}),  # parameters per agent
    "mappo": (MULTI_AGENT, ON_POLICY),
    "pqn": ("CartPole-v1", ON_POLICY),
    "pqn-vdn": (MULTI_AGENT, ON_POLICY),
    # a team's replay buffer (rewards and terminations per agent) and its values mixed at the global state
    "qmix": (MULTI_AGENT, {**OFF_POLICY, "n_step": 3, "hidden": (32, 32)}),
    # a recurrent policy: its memory is split with the environments, its minibatches are whole environments
    "ppo-gru": ("CartPole-v1@obs=0,2", RECURRENT),
    # a memory per agent, one recurrent torso per agent (stacked parameters) and a centralised critic
    "mappo-gru": (MULTI_AGENT, {**RECURRENT, "shared_params": False}),
    "pqn-gru": ("CartPole-v1@obs=0,2", RECURRENT),
    # agents acting in a box (MABrax's kind of action, on a cheap MPE task): a Gaussian per agent, no action mask
    "ippo-continuous": ("jaxmarl:MPE_simple_facmac_3a_v1", ON_POLICY),
    # the environment families of envs/: MiniGrid grids (image observations, the convolutional torso), Craftax's game
    "ppo-navix": ("navix:Navix-Empty-5x5-v0", ON_POLICY),
    "ppo-craftax": ("craftax:Craftax-Classic-Symbolic-v1", ON_POLICY),
    "ppo-xminigrid": ("xminigrid:MiniGrid-Empty-5x5", ON_POLICY),
    # observations with the actions allowed beside them (MaskedObs), the policy's probabilities masked
    "ppo-jumanji": ("jumanji:Knapsack-v1", ON_POLICY),
    # a search that steps the environments' states as its model, and games against random moves in a while_loop
    "alphazero": ("pgx:tic_tac_toe", {**ON_POLICY, "num_simulations": 4, "hidden": (32,)}),
}
# rows that are a recipe with other settings, and the recipe
VARIANT_OF = {"ppo-gru": "ppo", "mappo-gru": "mappo", "pqn-gru": "pqn", "ippo-continuous": "ippo", "ppo-navix": "ppo",
              "ppo-craftax": "ppo", "ppo-xminigrid": "ppo", "ppo-jumanji": "ppo"}
SEED = 3
EXACT = {
    "data-parallel-exact": lambda: DataParallel(4, shuffle="exact"),
    "population-exact": lambda: PopulationParallel(pop=2, data=2, shuffle="exact"),
    "actor-learner-synchronous": lambda: ActorLearner(2, 2, staleness=0, shuffle="exact"),
}
INEXACT = {
    "data-parallel-local": lambda: DataParallel(4),
    "actor-learner-stale": lambda: ActorLearner(2, 2, staleness=1, transfer_dtype="bfloat16"),
}
LONG = {"ppo-craftax"}  # Craftax's game takes minutes to compile on 2 cores, once per program: make test-long's
# rows under only some policies (the others run every row under every policy): Craftax's under the one that shards
# its state over the devices and claims SingleDevice's result, the other environment families' under the exact
# policies, each of which moves the environments' state its own way (sharded over the devices, vmapped into a
# population, placed on the actor devices); an inexact policy places them as its exact sibling does and differs in
# the learner's arithmetic, which the recipe's own row holds under it; and AlphaZero's under the exact policies, its
# search in the actor, its learner PPO's loop of shuffled minibatches (minibatch_epochs), which PPO's row holds under
# the inexact ones
UNDER = {"ppo-craftax": ("data-parallel-exact",), **{row: tuple(EXACT) for row in ("ppo-navix", "ppo-xminigrid",
                                                                                    "ppo-jumanji", "alphazero")}}


def test_the_matrix_covers_every_recipe() -> None:
    assert set(SMALL) - set(VARIANT_OF) == set(jf.recipes.RECIPES)


def make(recipe: str) -> jf.Algorithm:
    env, settings = SMALL[recipe]
    return jf.recipes.RECIPES[VARIANT_OF.get(recipe, recipe)].create(env, **settings)


def run(algorithm: jf.Algorithm, policy: jf.sharding.Policy) -> tuple[list[np.ndarray], jf.History]:
    program = jf.compile(algorithm, policy, chunk_iterations=2)
    history = program.run(jax.random.PRNGKey(SEED))
    return [np.asarray(x) for x in jax.tree.leaves(program.algorithm_state(history.state))], history


@functools.cache
def reference(recipe: str) -> list[np.ndarray]:
    """The final state of ``recipe``'s SingleDevice run, computed once per process."""
    return run(make(recipe), SingleDevice())[0]


# make test-fast's rows: one recipe for each kind of training state a policy splits, places or vmaps (an on-policy
# rollout and its minibatches, a prioritized n-step replay buffer, a team's stacked agents); make test runs every row
# under the exact policies
FAST = {"ppo", "dqn", "mappo"}
# make test's rows under the inexact policies, which differ from their exact siblings in the learner's arithmetic
# (minibatches shuffled on each device, replay sampled on each device; the actors a step behind, their transfers in
# bfloat16): FAST's, and one more row of each kind of state that arithmetic reads (a recurrent memory replayed in
# whole sequences, a continuous action's replay, a team's replay mixed at the global state); make test-long runs
# the other rows under them
INEXACT_IN_TEST = FAST | {"ppo-gru", "sac", "qmix"}


def cases(policies: dict[str, object], in_test: set[str] | None = None) -> list[object]:
    """Each row of ``SMALL`` under each of ``policies`` (of those ``UNDER`` names for it), marked for the target
    that runs it: ``FAST``'s rows in every target, Craftax's and those outside ``in_test`` (where given) in make
    test-long, the others in make test."""
    def marks(recipe: str) -> pytest.MarkDecorator:
        return pytest.mark.long if recipe in LONG or (in_test is not None and recipe not in in_test) else pytest.mark.slow

    return [(recipe, policy) if recipe in FAST else pytest.param(recipe, policy, marks=marks(recipe))
            for recipe in SMALL for policy in policies if policy in UNDER.get(recipe, policies)]


@pytest.mark.parametrize("recipe, policy", cases(EXACT))
def test_an_exact_policy_equals_single_device(recipe: str, policy: str) -> None:
    algorithm = make(recipe)
    if policy.startswith("population"):  # member 0 of two, seeded as the reference run
        state, _ = run(Population.of([algorithm, algorithm], [SEED, SEED + 1]), EXACT[policy]())
        state = [x[0] for x in state]
    else:
        state, _ = run(algorithm, EXACT[policy]())
    assert len(state) == len(reference(recipe))
    for x, y in zip(state, reference(recipe), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # no equality to check, a program each: make test runs INEXACT_IN_TEST's
@pytest.mark.parametrize("recipe, policy", cases(INEXACT, INEXACT_IN_TEST))
def test_an_inexact_policy_runs(recipe: str, policy: str) -> None:
    state, history = run(make(recipe), INEXACT[policy]())
    assert history.final["iteration"] == 4
    assert [x.shape for x in state] == [x.shape for x in reference(recipe)]
    assert all(np.isfinite(x).all() for x in state if np.issubdtype(x.dtype, np.floating))
    assert np.isfinite(history["episode_count"]).all()
