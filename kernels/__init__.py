"""The policy kernel: :class:`Policy` (compiled), the model file format and the numpy reference.

Imports nothing of control_node outside this package (tests/test_architecture.py checks it)."""
from control_node.kernels._policy import Policy, isa_missing
from control_node.kernels.model_file import ACTIVATIONS, ModelFileError, ModelSpec, load_model, save_model
from control_node.kernels.reference import (ConsistencyError, check_consistency, reference_act, reference_logits,
                                            reference_predict, reference_sequence)
from control_node.kernels.weights import WeightStorageError, measure_error

__all__ = ["Policy", "ModelSpec", "ModelFileError", "ConsistencyError", "ACTIVATIONS", "load_model", "save_model",
           "check_consistency", "reference_act", "reference_logits", "reference_predict", "reference_sequence",
           "isa_missing", "WeightStorageError", "measure_error"]
