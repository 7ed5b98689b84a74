"""User-facing integrations: the NequIP extension, the ASE calculator and the ``mlip-accel`` command.

Nothing here is imported by ``import mlip_accel``; each submodule imports its framework itself.
"""
