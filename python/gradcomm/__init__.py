"""gradcomm: gradient communication for distributed training.

The PyTorch backend lives in :mod:`gradcomm.torch`.
"""
