"""Every way to mis-configure a run: exit status 2, one message naming the setting, the
value and the fix (for the command line's own errors, one line and a pointer to
``--help``), no traceback, and nothing on disk touched or created. Every number is
bounded before any work: the cases that would overflow, hang, abort or run out of
memory end here within seconds."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from jaxrl_frag.app.cli import main

TRAIN = ["train", "ppo", "--env", "CartPole-v1"]
TINY = ["--num-envs", "4", "--num-steps", "8", "--total-steps", "64", "--chunk-iterations", "1"]
DQN = ["train", "dqn", "--env", "CartPole-v1"]
NITRO = [*TRAIN, "--boost", "nitro"]
INT32_MAX = "2,147,483,647"
HELP = "run 'jaxrl-frag train ppo --help' for the settings"
SPREAD = "jaxmarl:MPE_simple_spread_v3"

CASES = [
    # recipe and environment
    (["train", "a3c", "--env", "CartPole-v1"], ["invalid choice: 'a3c'", "ppo"]),
    (["train", "ppo", "--env", "CartPol-v1"], ["env='CartPol-v1'", "unknown environment", "did you mean CartPole-v1"]),
    (["train", "ppo"], ["--env"]),
    ([*TRAIN, "--learning-rate", "1e-3"], ["unrecognized arguments: --learning-rate"]),
    # recipe settings
    ([*TRAIN, "--num-envs", "0"], ["num_envs=0", "positive"]),
    ([*TRAIN, "--num-envs", "four"], ["--num-envs", "four"]),
    ([*TRAIN, "--num-steps", "-5"], ["num_steps=-5", "positive"]),
    ([*TRAIN, "--total-steps", "1.5"], ["--total-steps", "not a whole number"]),
    ([*TRAIN, "--total-steps", "100"], ["total_steps=100", "at least one iteration"]),
    ([*TRAIN, "--num-minibatches", "3"], ["num_minibatches=3", "4 * 128 = 512", "choose one of"]),
    ([*TRAIN, "--hidden", "0,64"], ["hidden=(0, 64)", "positive layer widths"]),
    ([*TRAIN, "--hidden", "wide"], ["--hidden", "comma-separated list of whole numbers"]),
    ([*TRAIN, "--lr=-1e-3"], ["lr=-0.001", "positive"]),
    ([*TRAIN, "--lr", "inf"], ["lr=inf", "finite"]),
    ([*TRAIN, "--gamma", "1.5"], ["gamma=1.5", "(0, 1]"]),
    ([*TRAIN, "--gae-lambda", "nan"], ["gae_lambda=nan", "finite"]),
    ([*TRAIN, "--ent-coef", "-0.1"], ["ent_coef=-0.1", "zero or positive"]),
    ([*TRAIN, "--action-dist", "beta"], ["action_dist='beta'", "gaussian, tanh-gaussian"]),
    ([*TRAIN, "--action-dist", "tanh-gaussian"], ["action_dist='tanh-gaussian'", "CartPole-v1's are discrete"]),
    ([*TRAIN, "--value-hidden", "256,0"], ["value_hidden=(256, 0)", "positive layer widths"]),
    (["train", "ppo", "--env", "ale:Breakout", "--value-hidden", "64,64"],
     ["value_hidden=(64, 64)", "atari torso", "--torso auto", "leave value_hidden out"]),
    ([*TRAIN, "--unroll-length", "5"], ["unroll_length=5", "must divide num_steps = 128", "or be 0"]),
    ([*TRAIN, "--reward-scale", "0"], ["reward_scale=0", "positive"]),
    (["train", "ippo", "--env", "jaxmarl:MPE_simple_spread_v3", "--action-dist", "tanh-gaussian"],
     ["action_dist='tanh-gaussian'", "IPPO's agents act with a Gaussian"]),
    # off-policy recipes
    (["train", "dqn", "--env", "Pendulum-v1"], ["env='Pendulum-v1'", "DQN supports discrete actions only"]),
    (["train", "sac", "--env", "CartPole-v1"], ["env='CartPole-v1'", "SAC supports continuous actions only"]),
    (["train", "dqn", "--env", "CartPole-v1", "--buffer-size", "16"], ["buffer_size=16", "raise it"]),
    (["train", "dqn", "--env", "CartPole-v1", "--tau", "0"], ["tau=0", "(0, 1]"]),
    (["train", "dqn", "--env", "CartPole-v1", "--td-loss", "l1"], ["td_loss='l1'", "mse, huber"]),
    (["train", "dqn", "--env", "CartPole-v1", "--epsilon-end", "2"], ["epsilon_end=2", "[0, 1]"]),
    (["train", "dqn", "--env", "CartPole-v1", "--learning-starts", "-1"], ["learning_starts=-1", "between 0"]),
    (["train", "sac", "--env", "Pendulum-v1", "--init-temperature", "0"], ["init_temperature=0", "positive"]),
    (["train", "td3", "--env", "CartPole-v1"], ["env='CartPole-v1'", "TD3 supports continuous actions only"]),
    (["train", "td3", "--env", "Pendulum-v1", "--policy-noise", "-0.2"], ["policy_noise=-0.2", "zero or positive"]),
    (["train", "td3", "--env", "Pendulum-v1", "--policy-delay", "0"], ["policy_delay=0", "positive"]),
    (["train", "qrdqn", "--env", "Pendulum-v1"], ["env='Pendulum-v1'", "QRDQN supports discrete actions only"]),
    (["train", "qrdqn", "--env", "CartPole-v1", "--quantiles", "0"], ["quantiles=0", "positive"]),
    (["train", "qrdqn", "--env", "CartPole-v1", "--kappa", "0"], ["kappa=0", "positive"]),
    (["train", "a2c", "--env", "CartPole-v1", "--num-minibatches", "3"], ["num_minibatches=3", "choose one of"]),
    # actor boosting
    ([*TRAIN, "--boost", "turbo"], ["--boost", "invalid choice: 'turbo'", "nitro"]),
    ([*TRAIN, "--boost", "nitro", "--boost-ladder", "64,8"], ["boost_ladder='64,8'", "ascending"]),
    ([*TRAIN, "--boost", "nitro", "--boost-minibatches", "count", "--num-minibatches", "3", "--boost-ladder", "3,7,9"],
     ["boost_ladder=7", "num_minibatches=3", "choose one of"]),
    ([*TRAIN, "--boost", "nitro", "--num-minibatches", "1", "--boost-ladder", "4,6"],
     ["boost_ladder='4,6'", "not a whole number", "make every rung divide 512", "--boost-minibatches size"]),
    ([*TRAIN, "--boost", "nitro", "--boost-minibatches", "size", "--num-minibatches", "1", "--boost-ladder", "4,6"],
     ["boost_ladder='4,6'", "not a whole number", "--boost-minibatches count"]),
    ([*TRAIN, "--boost", "nitro", "--num-envs", "8"], ["num_envs=8", "--boost-ladder", "drop --num-envs"]),
    ([*TRAIN, "--boost", "fixed", "--boost-fixed-actors", "24"], ["boost_fixed_actors=24", "rung of the ladder"]),
    ([*TRAIN, "--boost", "nitro", "--budget-steps", "100"], ["budget_steps=100", "one round at the bottom rung"]),
    ([*TRAIN, "--boost", "nitro", "--boost-decay", "1.5"], ["boost_decay=1.5", "(0, 1]"]),
    ([*TRAIN, "--boost", "nitro", "--boost-window", "1"], ["boost_window=1", ">= 2"]),
    ([*TRAIN, "--boost", "nitro", "--budget-cost=-1"], ["budget_cost=-1", "must be positive"]),
    ([*TRAIN, "--boost", "nitro", "--policy", "data-parallel"], ["policy='data-parallel'", "boosting takes --policy single"]),
    (["train", "dqn", "--env", "CartPole-v1", "--boost", "nitro"], ["recipe='DQN'", "on-policy recipes"]),
    (["train", "a2c", "--env", "CartPole-v1", "--boost", "gns"], ["num_minibatches=1", "at least 2 minibatches"]),
    # host environments
    (["train", "ppo", "--env", "gymnasium:CartPol-v1"], ["env='gymnasium:CartPol-v1'", "did you mean gymnasium:CartPole-v1"]),
    # Gymnasium's module:id: the module's own name and where to put it, not a pip install of it
    (["train", "ppo", "--env", "gymnasium:no_such_module:MyEnv-v0"],
     ["env='gymnasium:no_such_module:MyEnv-v0'", "cannot import 'no_such_module'", "put its folder on PYTHONPATH"]),
    (["train", "ppo", "--env", "ale:Breakot"], ["env='ale:Breakot'", "no such Atari game", "did you mean ale:Breakout"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--env-groups", "3"], ["env_groups=3", "divide num_envs = 4"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--env-workers", "3"], ["env_workers=3", "multiple of env_groups"]),
    ([*TRAIN, "--env-groups", "4"], ["env_groups=4", "host environments", "CartPole-v1 is a JAX environment"]),
    (["train", "ppo", "--env", "ale:Breakout", "--env-backend", "threads"],
     ["env_backend='threads'", "auto, processes, in-process"]),
    ([*TRAIN, "--env-backend", "in-process"], ["env_backend='in-process'", "CartPole-v1 is a JAX environment"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--env-backend", "ray", "--env-address", "127.0.0.1:1"],
     ["env_address='127.0.0.1:1'", "no Ray cluster answers there", "ray start --head"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--env-backend", "ray", "--env-address", "cluster"],
     ["env_address='cluster'", "host:port"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--env-backend", "ray", "--env-worker-resource", "envs"],
     ["env_worker_resource='envs'", "a local Ray has none", "--env-address"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--env-backend", "ray", "--env-lost-workers", "retry"],
     ["env_lost_workers='retry'", "stop", "restart"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--env-address", "127.0.0.1:6379"],
     ["env_address='127.0.0.1:6379'", "not an option of --env-backend processes", "ray"]),
    (["train", "ppo", "--env", "gymnasium:Pendulum-v1", "--normalize-obs"], ["normalize_obs=True", "turn it off"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--seeds", "2"], ["env='gymnasium:CartPole-v1'", "population"]),
    (["train", "ppo", "--env", "ale:Breakout", "--boost", "nitro"],
     ["boost='nitro'", "--env-backend in-process", "choose processes or ray"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--boost", "nitro", "--boost-ladder", "2,8", "--env-workers", "2"],
     ["boost_ladder=2", "num_envs=2", "in 2 workers and 2 groups steps whole workers", "give a multiple of 8"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--env-backend", "ray", "--env-keep-alive=-1"],
     ["env_keep_alive=-1.0", "zero (released at once) or more"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--env-keep-alive", "5"],
     ["env_keep_alive=5.0", "not an option of --env-backend processes", "ray"]),
    # multi-agent environments and recipes
    (["train", "ppo", "--env", SPREAD], [f"env='{SPREAD}'", "multi-agent environment (3 agents)", "ippo, mappo"]),
    (["train", "sac", "--env", "jaxmarl:ant_4x2"], ["multi-agent environment (4 agents)", "SAC acts for one agent"]),
    (["train", "ippo", "--env", "CartPole-v1"], ["env='CartPole-v1'", "has one agent", "jaxmarl: environment"]),
    (["train", "mappo", "--env", "jaxmarl:MPE_simple_spred_v3"], ["unknown JaxMARL environment", f"did you mean {SPREAD}"]),
    (["train", "ippo", "--env", SPREAD, "--normalize-obs"], ["normalize_obs=True", "has 3 agents", "turn it off"]),
    (["train", "mappo", "--env", SPREAD, "--scale-reward"], ["scale_reward=True", "has 3 agents"]),
    (["train", "ippo", "--env", "jaxmarl:humanoid_9|8", "--no-shared-params"],
     ["env='jaxmarl:humanoid_9|8'", "continuous actions of different shapes", "(9,)", "(8,)", "cannot be stacked"]),
    (["train", "ippo", "--env", SPREAD, "--torso", "cnn"], ["torso='cnn'", "needs image observations", "(3, 18)"]),
    (["train", "pqn-vdn", "--env", "jaxmarl:ant_4x2"], ["env='jaxmarl:ant_4x2'", "PQNVDN supports discrete actions only"]),
    (["train", "pqn", "--env", "Pendulum-v1"], ["env='Pendulum-v1'", "PQN supports discrete actions only"]),
    (["train", "pqn", "--env", "CartPole-v1", "--q-lambda", "1.5"], ["q_lambda=1.5", "[0, 1]"]),
    (["train", "pqn", "--env", "CartPole-v1", "--num-minibatches", "7"], ["num_minibatches=7", "choose one of"]),
    (["train", "pqn", "--env", "CartPole-v1", "--torso", "cnn"], ["torso='cnn'", "needs image observations"]),
    # games whose players alternate, and the planner that needs a model
    (["train", "dqn", "--env", "pgx:connect_four"], ["env='pgx:connect_four'", "two players who move in turn",
                                                     "DQN learns for one player", "(alphazero)",
                                                     "(pgx:connect_four@opponent=random)"]),
    (["train", "alphazero", "--env", "CartPole-v1"], ["env='CartPole-v1'", "not a model AlphaZero can search with",
                                                      "pgx:tic_tac_toe"]),
    (["train", "alphazero", "--env", "pgx:backgammon"], ["env='pgx:backgammon'", "draws its dice by chance",
                                                         "perfect information without chance"]),
    (["train", "alphazero", "--env", "pgx:tic_tac_toe", "--gumbel-scale", "-1"], ["gumbel_scale=-1", "0 or more"]),
    (["train", "alphazero", "--env", "pgx:tic_tac_toe", "--num-simulations", "0"], ["num_simulations=0", "positive"]),
    (["train", "alphazero", "--env", "pgx:tic_tac_toe", "--torso", "atari"], ["torso='atari'", "mlp, cnn"]),
    # recurrent policies and partially observed environments
    ([*DQN, "--memory", "gru"], ["unrecognized arguments: --memory", "--memory is a setting of ppo, a2c, impala",
                                 "not of dqn"]),
    (["train", "sac", "--env", "Pendulum-v1", "--memory", "lstm"], ["--memory is a setting of", "not of sac"]),
    (["train", "pqn-vdn", "--env", SPREAD, "--memory=gru"], ["memory='gru'", "PQNVDN's Q-networks are feed-forward"]),
    (["train", "pqn", "--env", "MemoryChain-bsuite", "--memory", "gru", "--num-envs", "6", "--num-steps", "8",
      "--num-minibatches", "4"], ["num_minibatches=4", "whole environments' sequences", "divide num_envs = 6"]),
    ([*TRAIN, "--memory", "rnn"], ["memory='rnn'", "choose one of none, gru, lstm"]),
    ([*TRAIN, "--memory", "gru", "--num-minibatches", "8"],
     ["num_minibatches=8", "whole environments' sequences", "divide num_envs = 4", "[1, 2, 4]"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--memory", "gru"],
     ["memory='gru'", "runs on the host", "--memory none"]),
    (["train", "ppo", "--env", "Breakout-MinAtar", "--memory", "lstm"],
     ["memory='lstm'", "vector observations", "(10, 10, 4)", "--memory none"]),
    (["train", "ppo", "--env", "CartPole-v1@obs=0,4"],
     ["env='CartPole-v1@obs=0,4'", "observation entry 4", "observes 4 entries (0 to 3)"]),
    (["train", "ppo", "--env", "CartPole-v1@obs=-1"],
     ["env='CartPole-v1@obs=-1'", "whole numbers from 0", "CartPole-v1@obs=0,2"]),
    (["train", "ppo", "--env", "CartPole-v1@obs=velocity"], ["env='CartPole-v1@obs=velocity'", "comma-separated"]),
    (["train", "ppo", "--env", "CartPole-v1@obs="], ["env='CartPole-v1@obs='", "comma-separated"]),
    (["train", "ppo", "--env", "CartPole-v1@obs=2,2"], ["env='CartPole-v1@obs=2,2'", "twice"]),
    (["train", "ppo", "--env", "CartPol-v1@obs=0"], ["env='CartPol-v1'", "did you mean CartPole-v1"]),
    (["train", "ppo", "--env", "Breakout-MinAtar@obs=0"], ["env='Breakout-MinAtar@obs=0'", "masks vector observations"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1@obs=0"], ["env='gymnasium:CartPole-v1@obs=0'", "runs on the host"]),
    (["train", "ppo", "--env", "pgx:tic_tac_toe@opponent=best"],
     ["env='pgx:tic_tac_toe@opponent=best'", "not @opponent=best", "write @opponent=random"]),
    (["train", "ppo", "--env", "CartPole-v1@opponent=random"],
     ["env='CartPole-v1@opponent=random'", "not a game of two players", "drop @opponent=random"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1@opponent=random"],
     ["env='gymnasium:CartPole-v1@opponent=random'", "runs on the host", "drop @opponent=random"]),
    (["train", "ippo", "--env", f"{SPREAD}@obs=0"], [f"env='{SPREAD}@obs=0'", "has 3 agents", "drop @obs=0"]),
    # an environment's options in its id (envs.id_options)
    (["train", "ppo", "--env", "brax:ant@colour=red"],
     ["env='brax:ant@colour=red'", "takes no option colour", "its options: backend, episode_length, action_repeat"]),
    (["train", "ppo", "--env", "brax:ant@backend=nope"], ["backend='nope'", "generalized, positional, spring, mjx"]),
    (["train", "ppo", "--env", "brax:ant@episode_length=0"], ["episode_length=0", "positive integer"]),
    (["train", "ppo", "--env", "brax:ant@backend=spring@backend=positional"],
     ["env='brax:ant@backend=spring@backend=positional'", "gives the option backend twice"]),
    (["train", "ppo", "--env", "CartPole-v1@backend"], ["env='CartPole-v1@backend'", "@name=value", "@backend is not one"]),
    (["train", "ppo", "--env", "CartPole-v1@gravity=3"],
     ["env='CartPole-v1@gravity=3'", "CartPole-v1 refuses its options", "gravity"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1@render_mode=human"],
     ["env='gymnasium:CartPole-v1@render_mode=human'", "takes no options in its id", "drop @render_mode=human"]),
    # distribution policy
    ([*TRAIN, "--policy", "anakin"], ["--policy", "invalid choice: 'anakin'"]),
    ([*TRAIN, "--devices", "0"], ["devices=0", "positive"]),
    ([*TRAIN, "--policy", "data-parallel", "--devices", "3"], ["devices=3", "does not divide across 3 devices"]),
    ([*TRAIN, "--policy", "data-parallel", "--agent-shards", "0"], ["agent_shards=0", "positive"]),
    ([*TRAIN, "--policy", "data-parallel", "--devices", "4", "--agent-shards", "3"], ["agent_shards=3", "divide devices=4"]),
    ([*TRAIN, "--policy", "data-parallel", "--devices", "4", "--agent-shards", "2"],
     ["agent_shards=2", "declares no state with an 'agents' axis", "drop --agent-shards"]),
    ([*TRAIN, "--shuffle", "global"], ["--shuffle", "invalid choice: 'global'"]),
    ([*TRAIN, "--policy", "actor-learner", "--staleness", "-1"], ["staleness=-1", "0 (synchronous)"]),
    ([*TRAIN, "--policy", "actor-learner", "--actor-devices", "0"], ["actor_devices=0", "positive"]),
    ([*TRAIN, "--policy", "actor-learner", "--transfer-dtype", "fp8"], ["--transfer-dtype", "invalid choice: 'fp8'"]),
    ([*TRAIN, "--policy", "actor-learner", "--seeds", "2"], ["policy='actor-learner'", "populations"]),
    (["explain", "ppo", "--env", "CartPole-v1", "--draw", "graph.gif"], ["draw='graph.gif'", ".png, .svg"]),
    # seeds and sweeps
    ([*TRAIN, "--seeds", "0"], ["seeds=0", "positive"]),
    ([*TRAIN, "--sweep", "num_envs=4,8"], ["sweep='num_envs'", "static field", "separate runs"]),
    ([*TRAIN, "--sweep", "lr=fast"], ["sweep='lr=fast'", "numbers"]),
    ([*TRAIN, "--sweep", "lr"], ["sweep='lr'", "NAME=V1,V2"]),
    ([*TRAIN, "--sweep", "lr=loguniform:1e-5:1e-2"], ["samples=None", "--samples"]),
    ([*TRAIN, "--sweep", "lr=gauss:0:1", "--samples", "4"], ["sweep='lr=gauss:0:1'", "uniform, loguniform"]),
    ([*TRAIN, "--sweep", "learning_rate=1e-3"], ["sweep='learning_rate'", "sweepable"]),
    ([*TRAIN, "--samples", "8"], ["samples=8", "random search"]),
    # run length, rows and checkpoints
    ([*TRAIN, "--chunk-iterations", "0"], ["chunk_iterations=0", "positive"]),
    ([*TRAIN, *TINY[:6], "--chunk-iterations", "2", "--checkpoint-every", "3"],
     ["checkpoint_every=3", "multiple of chunk_iterations (2)", "e.g. 2"]),
    ([*TRAIN, "--keep-checkpoints", "0"], ["keep_checkpoints=0", "at least one"]),
    # run directories
    ([*TRAIN, "--run-dir", "{file}"], ["run_dir=", "is a file"]),
    ([*TRAIN, "--run-dir", "{existing}"], ["run_dir=", "already holds files", "--resume", "--overwrite"]),
    ([*TRAIN, "--run-dir", "{existing}", "--resume", "--overwrite"], ["--resume and --overwrite exclude each other"]),
    ([*TRAIN, "--resume"], ["resume=True", "--run-dir"]),
    ([*TRAIN, "--run-dir", "{empty}", "--resume"], ["holds no run to resume"]),
    ([*TRAIN, *TINY, "--run-dir", "{existing}", "--resume", "--lr", "1e-3"],
     ["lr: 0.00025 -> 0.001", "jaxrl-frag resume"]),
    (["resume", "{empty}"], ["holds no run to resume (no config.json)"]),
    (["resume", "{existing}", "--override", "lr=1e-3"], ["override='lr=1e-3'", "cannot change in a resumed run"]),
    (["resume", "{existing}", "--override", "total_steps=lots"], ["override='total_steps=lots'", "whole number"]),
    (["resume", "{existing}", "--override", "total_steps"], ["override='total_steps'", "NAME=VALUE"]),
    # the command line's own errors: one line, then where the settings are
    ([*TRAIN, "--num-envs", "nan"], ["--num-envs: 'nan' is not a whole number", HELP]),
    ([*TRAIN, "--num-envs", "inf"], ["--num-envs: 'inf' is not a whole number", HELP]),
    ([*TRAIN, "--num-envs", "-inf"], ["--num-envs: '-inf' is not a whole number", HELP]),
    ([*TRAIN, "--num-envs", "2.5"], ["--num-envs: '2.5' is not a whole number", HELP]),
    ([*TRAIN, "--num-steps", "0x10"], ["--num-steps: '0x10' is not a whole number", HELP]),
    ([*TRAIN, "--seed", "1.5"], ["--seed: '1.5' is not a whole number", HELP]),
    ([*TRAIN, "--total-steps", "1e"], ["--total-steps: '1e' is not a whole number", HELP]),
    ([*TRAIN, "--total-steps"], ["--total-steps: expected one argument", HELP]),
    ([*TRAIN, "--total-steps", "1e400"], ["--total-steps: '1e400' is too large for any setting", HELP]),
    ([*TRAIN, "--lr", "fast"], ["--lr: invalid float value: 'fast'", HELP]),
    ([*TRAIN, "--hidden", "abc"], ["--hidden: 'abc' is not a comma-separated list", HELP]),
    ([*TRAIN, "--hidden", ""], ["--hidden: '' is not a comma-separated list", HELP]),
    ([*TRAIN, "--hidden", "64,x"], ["--hidden: '64,x' is not a comma-separated list", HELP]),
    ([*NITRO, "--boost-ladder", ""], ["--boost-ladder: '' is not a comma-separated list", HELP]),
    ([*TRAIN, "--boost", "boost"], ["--boost: invalid choice: 'boost'", HELP]),
    ([*TRAIN, "--policy", "DataParallel"], ["--policy: invalid choice: 'DataParallel'", "data-parallel", HELP]),
    (["train", "ppo", "--seed", "1"], ["the following arguments are required: --env", HELP]),
    (["train", "ppo", "--env"], ["--env: expected one argument", HELP]),
    (["train"], ["the following arguments are required: RECIPE", "run 'jaxrl-frag train --help'"]),
    ([], ["the following arguments are required: COMMAND", "run 'jaxrl-frag --help'"]),
    (["resume"], ["the following arguments are required: run_dir", "run 'jaxrl-frag resume --help'"]),
    (["fly"], ["invalid choice: 'fly'", "run 'jaxrl-frag --help'"]),
    ([*TRAIN, "--devices", "eight"], ["--devices: 'eight' is not a whole number", HELP]),
    ([*TRAIN, "--devices"], ["--devices: expected one argument", HELP]),
    # negative numbers reach validation, in every form float reads
    ([*TRAIN, "--lr", "-1e-3"], ["lr=-0.001: must be positive"]),
    ([*TRAIN, "--lr", "-.001"], ["lr=-0.001: must be positive"]),
    ([*TRAIN, "--lr", "-inf"], ["lr=-inf", "finite"]),
    ([*TRAIN, "--gamma", "-5E-1"], ["gamma=-0.5", "(0, 1]"]),
    ([*TRAIN, "--ent-coef", "-1e-2"], ["ent_coef=-0.01", "zero or positive"]),
    ([*TRAIN, "--max-grad-norm", "-0"], ["max_grad_norm=-0.0", "positive"]),
    ([*TRAIN, "--num-steps", "-1e3"], ["num_steps=-1000", "positive"]),
    ([*TRAIN, "--total-steps", "-1e30"], ["total_steps=-1000000000000000000000000000000", "positive"]),
    ([*TRAIN, "--devices", "-1"], ["devices=-1", "positive"]),
    ([*TRAIN, "--seed", "-1"], ["seed=-1", "zero or a positive integer"]),
    # run length: iteration and update counters are int32, env step counts float64
    ([*TRAIN, "--total-steps", "1e30"], ["total_steps=1000000000000000000000000000000", "9,007,199,254,740,992",
                                         "float64"]),
    ([*TRAIN, "--total-steps", "1e12"], ["total_steps=1000000000000", "31,250,000,000 optimizer updates",
                                         INT32_MAX, "lower --total-steps"]),
    ([*TRAIN, "--total-steps", "2e12", "--no-anneal-lr"], ["total_steps=2000000000000", "3,906,250,000 iterations",
                                                           INT32_MAX, "raise --num-envs"]),
    ([*TRAIN, "--total-steps", "0"], ["total_steps=0", "positive"]),
    (["train", "a2c", "--env", "CartPole-v1", "--total-steps", "1e12"],
     ["total_steps=1000000000000", "7,812,500,000 iterations"]),
    (["explain", "ppo", "--env", "CartPole-v1", "--total-steps", "1e30"], ["total_steps=", "float64"]),
    (["resume", "{existing}", "--override", "total_steps=1e30"], ["total_steps=1000000000000000000000000000000",
                                                                  "9,007,199,254,740,992"]),
    (["resume", "{existing}", "--override", "total_steps=1e12"], ["total_steps=1000000000000", INT32_MAX]),
    (["resume", "{existing}", "--override", "total_steps=-1e3"], ["total_steps=-1000", "positive"]),
    (["resume", "{existing}", "--override", "chunk_iterations=1e10"], ["chunk_iterations=10000000000", INT32_MAX]),
    (["resume", "{existing}", "--override", "keep_checkpoints=0"], ["keep_checkpoints=0", "at least one"]),
    # sizes: samples per iteration and array sizes, checked before anything is traced
    ([*TRAIN, "--num-envs", "1e9", "--total-steps", "2e11"], ["num_envs=1000000000", "128,000,000,000 samples",
                                                              INT32_MAX, "lower --num-envs or --num-steps"]),
    ([*TRAIN, "--num-envs", "3e9"], ["num_envs=3000000000", f"at most {INT32_MAX}"]),
    ([*TRAIN, "--num-envs", "1_000_000_000_000"], ["num_envs=1000000000000", f"at most {INT32_MAX}"]),
    ([*TRAIN, "--num-minibatches", "1e30"], ["num_minibatches=", f"at most {INT32_MAX}"]),
    ([*TRAIN, "--num-epochs", "0"], ["num_epochs=0", "positive"]),
    ([*TRAIN, "--num-epochs", "1e10"], ["num_epochs=10000000000", f"at most {INT32_MAX}"]),
    ([*TRAIN, "--hidden", "3e9"], ["hidden=(3000000000,)", f"at most {INT32_MAX}"]),
    ([*TRAIN, "--hidden", "64,-64"], ["hidden=(64, -64)", "positive layer widths"]),
    # a large batch whose divisors the message suggests: found in sqrt(batch) steps
    ([*TRAIN, "--num-envs", "65537", "--num-steps", "32749", "--total-steps", "3e9", "--num-minibatches", "3"],
     ["num_minibatches=3", "65537 * 32749 = 2146271213", "[1, 32749, 65537, 2146271213]"]),
    (["train", "impala", "--env", "CartPole-v1", "--num-minibatches", "3"], ["num_minibatches=3", "[1, 2, 4, 8, 16]"]),
    (["train", "a2c", "--env", "CartPole-v1", "--num-envs", "7", "--num-steps", "11", "--num-minibatches", "5"],
     ["num_minibatches=5", "[1, 7, 11, 77]"]),
    # memory: the training state before compiling (XLA aborts the process compiling absurd sizes), the
    # compiled program before it runs
    ([*TRAIN, "--hidden", "1e9,1e9"], ["memory=", "GiB", "training state alone", "--hidden"]),
    ([*TRAIN, "--num-envs", "1e7", "--num-minibatches", "1", "--total-steps", "2e9"],
     ["memory=", "GiB", "XLA's memory analysis", "lower --num-envs, --num-steps or --hidden, or raise --num-minibatches"]),
    # devices
    ([*TRAIN, "--policy", "data-parallel", "--devices", "100000"], ["devices=100000", "at most 4,096", "XLA's CPU client"]),
    ([*TRAIN, "--policy", "actor-learner", "--actor-devices", "5000"], ["devices=5001", "at most 4,096"]),
    (["explain", "ppo", "--env", "CartPole-v1", "--devices", "1e30"], ["devices=", "at most 4,096"]),
    (["resume", "{existing}", "--override", "devices=100000"], ["devices=100000", "at most 4,096"]),
    ([*TRAIN, "--policy", "actor-learner", "--staleness", "1e9"], ["staleness=1000000000", "at most 1024"]),
    ([*TRAIN, "--num-processes", "1e30"], ["num_processes=", f"at most {INT32_MAX}"]),
    ([*TRAIN, "--num-processes", "2"], ["coordinator=None", "--coordinator HOST:PORT"]),
    # seeds and populations
    ([*TRAIN, "--seed", "1e10"], ["seed=10000000000", "at most 4,294,967,295", "uint32"]),
    ([*TRAIN, "--seeds", "1e30"], ["seeds=1000000000000000000000000000000", "uint32"]),
    ([*TRAIN, "--seed", "4294967295", "--seeds", "2"], ["seeds=2", "at most 1", "from --seed 4294967295 on"]),
    ([*TRAIN, "--seeds", "-2"], ["seeds=-2", "positive"]),
    ([*TRAIN, "--seeds", "1e5"], ["population=100000", "at most 65,536"]),
    ([*TRAIN, "--sweep", "lr=" + ",".join(f"{i}e-5" for i in range(1, 301)), "--seeds", "300"],
     ["population=90000", "split the sweep"]),
    ([*TRAIN, "--sweep", "lr=loguniform:1e-5:1e-2", "--samples", "1e30"], ["population=", "at most 65,536"]),
    ([*TRAIN, "--sweep", "lr=loguniform:1e-5:1e-2", "--samples", "-1"], ["samples=-1", "N > 0"]),
    ([*TRAIN, "--sweep", ""], ["sweep=''", "NAME=V1,V2"]),
    # rows and checkpoints
    ([*TRAIN, "--chunk-iterations", "1e10"], ["chunk_iterations=10000000000", f"at most {INT32_MAX}"]),
    ([*TRAIN, "--chunk-iterations", "-1"], ["chunk_iterations=-1", "positive"]),
    ([*TRAIN, "--keep-checkpoints", "-1"], ["keep_checkpoints=-1", "at least one"]),
    # environments
    (["train", "ppo", "--env", ""], ["env=''", "unknown environment"]),
    ([*TRAIN, "--env-workers", "1e30"], ["env_workers=", "host environments"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--env-groups", "0"], ["env_groups=0", "positive"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--env-groups", "1e30"], ["env_groups=", f"at most {INT32_MAX}"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--env-workers", "-2"], ["env_workers=-2", "multiple of env_groups"]),
    ([*TRAIN, "--torso", "cnn"], ["torso='cnn'", "image observations"]),
    ([*TRAIN, "--torso", "resnet"], ["torso='resnet'", "auto, atari, cnn, mlp"]),
    # actor boosting
    ([*NITRO, "--budget-steps", "1e30"], ["budget_steps=", "int32", "lower --budget-steps"]),
    ([*NITRO, "--total-steps", "3e9"], ["budget_steps=3000000000", "int32", "(default --total-steps)"]),
    ([*NITRO, "--boost-ladder", "8,1e30"], ["boost_ladder=", f"at most {INT32_MAX}"]),
    ([*NITRO, "--boost-ladder=-8,8"], ["boost_ladder=-8", "positive"]),
    ([*NITRO, "--boost-window", "1e30"], ["boost_window=", f"at most {INT32_MAX}"]),
    ([*NITRO, "--boost-probe-iterations", "-3"], ["boost_probe_iterations=-3", ">= 2"]),
    # off-policy recipes: their state counts environment steps in int32
    ([*DQN, "--total-steps", "3e9"], ["total_steps=3000000000", f"at most {INT32_MAX}", "int32"]),
    ([*DQN, "--buffer-size", "1e30"], ["buffer_size=", f"at most {INT32_MAX}"]),
    ([*DQN, "--num-updates", "1e9"], ["total_steps=200000", "optimizer updates", INT32_MAX]),
    ([*DQN, "--learning-starts", "1e30"], ["learning_starts=", "between 0 and total_steps"]),
    ([*DQN, "--n-step", "0"], ["n_step=0", "positive"]),
    ([*DQN, "--target-every", "1e30"], ["target_every=", f"at most {INT32_MAX}"]),
    (["train", "sac", "--env", "Pendulum-v1", "--minibatch-size", "0"], ["minibatch_size=0", "positive"]),
    # evaluate: what it reads, how many episodes, where the GIF goes
    (["evaluate", "{empty}"], ["run_dir=", "no config.json", "directory of an earlier run"]),
    (["evaluate", "{file}"], ["run_dir=", "is a file"]),
    (["evaluate", "{configured}"], ["run_dir=", "holds no checkpoint", "jaxrl-frag resume"]),
    (["evaluate", "{existing}", "--episodes", "0"], ["episodes=0", "positive"]),
    (["evaluate", "{existing}", "--episodes", "1e30"], ["episodes=", "at most 1,000,000"]),
    (["evaluate", "{existing}", "--seed", "-1"], ["seed=-1", "zero or a positive integer"]),
    (["evaluate", "{existing}", "--member", "1"], ["member=1", "not a population", "drop --member"]),
    (["evaluate", "{existing}", "--greedy", "--sample"], ["'--sample' given after '--greedy'", "give it once"]),
    (["evaluate", "{existing}", "--video", "episode.avi"], ["video='episode.avi'", "ending in .gif or .mp4"]),
    (["evaluate", "{existing}", "--video", "{file}.mp4"], ["video=", "exists and is not an MP4"]),
    (["evaluate", "{configured}", "--video", "episode.gif"],
     ["video='episode.gif'", "Acrobot-v1 cannot be drawn", "CartPole-v1, Pendulum-v1", "drop --video"]),
    (["evaluate", "{existing}", "--video", "{file}.gif"], ["video=", "exists and is not a GIF"]),
    (["evaluate", "{existing}", "--video", "missing/episode.gif"], ["video=", "is not a directory"]),
    (["evaluate", "{foreign_eval}"], ["run_dir=", "eval.csv that no evaluation wrote", "move it elsewhere"]),
    # evaluation during training: counts, and the runs it cannot act in
    ([*TRAIN, "--eval-every", "0"], ["eval_every=0", "positive"]),
    ([*TRAIN, "--eval-every", "1e10"], ["eval_every=", f"at most {INT32_MAX}"]),
    ([*TRAIN, "--eval-every", "5", "--eval-episodes", "-1"], ["eval_episodes=-1", "positive"]),
    ([*TRAIN, "--eval-every", "5", "--eval-episodes", "2e6"], ["eval_episodes=", "at most 1,000,000"]),
    ([*TRAIN, "--eval-episodes", "5"], ["eval_episodes=5", "give --eval-every too"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--eval-every", "5"],
     ["eval_every=5", "host environment", "jaxrl-frag evaluate"]),
    ([*NITRO, "--eval-every", "5"], ["eval_every=5", "no policy to act with", "boosted"]),
    # combinations of settings: refused from what recipes, transforms and policies declare they run
    ([*NITRO, "--memory", "gru"], ["memory='gru'", "recurrent policy", "--memory none", "--boost off"]),
    ([*NITRO, "--memory", "lstm", "--boost-minibatches", "count"], ["memory='lstm'", "--memory none"]),
    ([*TRAIN, "--policy", "population"],
     ["policy='population'", "trains one member", "--seeds N (N > 1)", "--sweep", "--policy single or data-parallel"]),
    (["explain", "ppo", "--env", "CartPole-v1", "--policy", "population", "--devices", "2"],
     ["policy='population'", "--seeds N (N > 1)"]),
    ([*TRAIN, "--policy", "data-parallel", "--devices", "2", "--seeds", "2"],
     ["policy='data-parallel'", "does not run populations", "--seeds 2", "use --policy single or population",
      "drop --seeds"]),
    ([*TRAIN, "--policy", "data-parallel", "--sweep", "lr=1e-3,1e-4"],
     ["policy='data-parallel'", "--sweep lr=1e-3,1e-4", "--policy single or population", "drop --sweep"]),
    ([*TRAIN, "--policy", "actor-learner", "--boost", "nitro"],
     ["policy='actor-learner'", "boosted runs", "boosting takes --policy single;", "drop --boost"]),
    ([*NITRO, "--policy", "population", "--devices", "2", "--seeds", "2"],
     ["policy='population'", "boosted runs", "boosting takes --policy single;", "drop --boost"]),
    ([*TRAIN, "--policy", "data-parallel", "--boost", "fixed", "--seeds", "2"], ["policy='data-parallel'", "populations"]),
    # flags are never abbreviated
    ([*TRAIN, "--num", "4"], ["unrecognized arguments: --num"]),
    ([*TRAIN, "--total", "64"], ["unrecognized arguments: --total"]),
    ([*TRAIN, "--pol", "data-parallel"], ["unrecognized arguments: --pol"]),
    (["evaluate", "{existing}", "--episode", "3"], ["unrecognized arguments: --episode"]),
    (["resume", "{existing}", "--overr", "total_steps=128"], ["unrecognized arguments: --overr"]),
    # lists refuse empty elements, and a setting given twice is refused, not dropped
    ([*TRAIN, "--hidden", "64,,64"], ["--hidden: '64,,64' is not a comma-separated list", "an element is empty", HELP]),
    ([*TRAIN, "--hidden", "64,"], ["--hidden: '64,' is not a comma-separated list", "an element is empty", HELP]),
    ([*NITRO, "--boost-ladder", ",8,16"], ["--boost-ladder: ',8,16' is not", "an element is empty", HELP]),
    ([*TRAIN, "--sweep", "lr=1e-3,,1e-4"], ["sweep='lr=1e-3,,1e-4'", "numbers"]),
    ([*TRAIN, "--sweep", "lr=1e-3", "--sweep", "lr=1e-4"],
     ["sweep='lr=1e-4'", "sweeps lr again", "--sweep lr=1e-3", "give each name once"]),
    (["resume", "{existing}", "--override", "total_steps=128", "--override", "total_steps=256"],
     ["override='total_steps=256'", "overridden twice", "total_steps=128", "give it once"]),
    ([*TRAIN, "--num-envs", "4", "--num-envs", "8"], ["'--num-envs 8' given after '--num-envs 4'", "give it once", HELP]),
    ([*TRAIN, "--num-envs=4", "--num-envs", "8"], ["'--num-envs 8' given after '--num-envs=4'", "give it once"]),
    ([*TRAIN, "--anneal-lr", "--no-anneal-lr"], ["'--no-anneal-lr' given after '--anneal-lr'", "give it once"]),
    ([*TRAIN, "--devices", "2", "--devices", "4"], ["'--devices 4' given after '--devices 2'", "give it once"]),
    ([*TRAIN, "--policy", "single", "--policy", "data-parallel"], ["'--policy data-parallel' given after", "give it once"]),
    (["evaluate", "{existing}", "--episodes", "3", "--episodes", "4"], ["'--episodes 4' given after '--episodes 3'"]),
    (["resume", "{existing}", "--join-timeout", "5", "--join-timeout", "9"], ["'--join-timeout 9' given after"]),
    # spaces around '=' in --override are read as none
    (["resume", "{existing}", "--override", "lr = 1e-3"], ["override='lr = 1e-3'", "'lr' cannot change"]),
    (["resume", "{existing}", "--override", "total_steps = lots"], ["override='total_steps = lots'", "whole number"]),
    *([] if importlib.util.find_spec("Box2D") is not None else [  # an optional dependency missing
        (["train", "ppo", "--env", "gymnasium:LunarLander-v3"],
         ["env='gymnasium:LunarLander-v3'", "needs the module 'Box2D'", 'pip install "gymnasium[box2d]"']),
        (["evaluate", "{lunar}"], ["env='gymnasium:LunarLander-v3'", "'Box2D'", 'pip install "gymnasium[box2d]"']),
    ]),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An existing finished run, an empty directory and a plain file; a run's config.json
    alone (on Acrobot-v1, no checkpoint), a run beside an eval.csv of someone else's, and
    a run whose config.json names gymnasium:LunarLander-v3."""
    root = tmp_path_factory.mktemp("bad_input")
    existing = root / "existing"
    assert main([*TRAIN, *TINY, "--run-dir", str(existing)]) == 0
    (root / "empty").mkdir()
    (root / "file").write_text("not a directory\n")
    (root / "file.gif").write_text("not a GIF\n")
    (root / "file.mp4").write_text("not an MP4\n")
    config = json.loads((existing / "config.json").read_text())
    config["settings"]["env"] = "Acrobot-v1"
    (root / "configured").mkdir()
    (root / "configured" / "config.json").write_text(json.dumps(config))
    shutil.copytree(existing, root / "foreign_eval", ignore=shutil.ignore_patterns("run.lock"))
    (root / "foreign_eval" / "eval.csv").write_text("seed,score\n0,1\n")
    shutil.copytree(existing, root / "lunar", ignore=shutil.ignore_patterns("run.lock"))
    config["settings"]["env"] = "gymnasium:LunarLander-v3"
    (root / "lunar" / "config.json").write_text(json.dumps(config))
    return {name: root / name for name in ("existing", "empty", "file", "configured", "foreign_eval", "lunar")}


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))}


def test_there_are_at_least_150_cases() -> None:
    assert len(CASES) >= 150


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_exits_2_with_a_message_and_touches_nothing(
    argv: list[str], expected: list[str], places: dict[str, Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # a default run directory would appear here
    argv = [a.format(**{k: str(v) for k, v in places.items()}) for a in argv]
    root = places["existing"].parent
    before = _snapshot(root)
    parser_error = False
    try:
        status = main(argv)
    except SystemExit as exit_:  # the parser's own errors
        status, parser_error = exit_.code, True
    err = capsys.readouterr().err
    assert status == 2, err
    for text in expected:
        assert text in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and "usage:" not in err and len(lines) <= 3, err
    assert [line for line in lines if line.startswith("jaxrl-frag: error: ")], err
    if parser_error:
        assert lines[-1].startswith("run 'jaxrl-frag") and lines[-1].endswith(" --help' for the settings"), err
    assert _snapshot(root) == before
    assert list(tmp_path.iterdir()) == []


def test_an_override_reads_spaces_around_its_equals_sign() -> None:
    from jaxrl_frag.app.spec import parse_overrides

    assert parse_overrides(["total_steps = 4096", " keep_checkpoints= 2 "]) == {"total_steps": 4096, "keep_checkpoints": 2}


@pytest.mark.parametrize("argv", [["train", "ppo", "--env", "CartPole-v1"], ["explain", "ppo", "--env", "CartPole-v1"],
                                  ["resume", "run"], ["evaluate", "run"]])
def test_no_parser_takes_an_abbreviated_flag(argv: list[str]) -> None:
    import argparse

    from jaxrl_frag.app.cli import build_parser
    from jaxrl_frag.app.cli.flags import Parser
    from jaxrl_frag.app.cli.runtime import add_runtime_flags

    parsers, seen = [build_parser(argv)], []
    while parsers:
        parser = parsers.pop()
        seen.append(parser)
        assert parser.allow_abbrev is False, parser.prog
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    assert len(seen) > 3
    early = Parser(add_help=False)  # as runtime reads the device and process flags ahead of the others
    add_runtime_flags(early)
    assert early.parse_known_args(["--num", "4"])[0].num_processes is None


def test_a_policy_refuses_from_python_what_it_declares_it_does_not_run() -> None:
    import jaxrl_frag as jf
    from jaxrl_frag import recipes, sharding, transforms
    from jaxrl_frag.errors import ConfigError

    algo = recipes.RECIPES["ppo"].create("CartPole-v1", num_envs=4, num_steps=8, total_steps=64)
    population = transforms.Population.of([algo, algo], [0, 1])
    with pytest.raises(ConfigError, match="policy='data-parallel': runs one algorithm and does not run populations"):
        jf.compile(population, sharding.DataParallel(devices=1))
    with pytest.raises(ConfigError, match="policy='population': places a population's members"):
        jf.compile(algo, sharding.PopulationParallel(pop=1))
    assert sharding.runs(sharding.SingleDevice) == {"populations": "allowed", "boosts": True}
    assert sharding.running("boosts", True) == ["single"]
    assert sharding.running("populations", True) == ["single", "population"]
