"""A user's own algorithm (``reinforce``) and environment (``Chain-v0``, ``chain:<cells>``)
for jaxrl-frag, declared in this package's entry points."""
