"""The application: what a user runs, built on the compiler below it.

The command line (``cli``), the run directory it writes (``rundir``: configuration,
metrics, TensorBoard, checkpoints, the learning curve), progress and plots, population
summaries and sweeps, evaluation of a trained run and its videos. Nothing under
``jaxrl_frag`` (the compiler core), ``envs``, ``transforms``, ``sharding`` or
``recipes`` imports from here.
"""
