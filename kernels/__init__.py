"""Compiled MLP policy kernel. See :class:`Policy`."""
from control_node.kernels._policy import Policy
from control_node.kernels.model_file import ModelFileError, ModelSpec, load_model, save_model
from control_node.kernels.reference import ConsistencyError, check_consistency, reference_logits, reference_predict

__all__ = ["Policy", "ModelSpec", "ModelFileError", "ConsistencyError", "load_model", "save_model",
           "check_consistency", "reference_logits", "reference_predict"]
