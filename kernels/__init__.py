"""Compiled MLP policy kernel. See :class:`Policy`."""
from kernels._policy import Policy
from kernels.model_file import ModelFileError, ModelSpec, load_model, save_model
from kernels.reference import ConsistencyError, check_consistency, reference_logits, reference_predict

__all__ = ["Policy", "ModelSpec", "ModelFileError", "ConsistencyError", "load_model", "save_model",
           "check_consistency", "reference_logits", "reference_predict"]
