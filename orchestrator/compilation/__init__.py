"""The compile room: the stage loop (`COMPILE_STAGES`), the device check that runs the serialized
program in the real runtime, dead-constant pruning and the adapter over ExecuTorch's exir.

It owns turning a captured model into a serialized program; placement decisions come from
partitioners/, costs from cost_models/, and what is written to disk from orchestrator.artifacts.
"""
