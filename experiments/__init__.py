"""Fault-injection trainer that produces the sample checkpoints ckptscan ships.

Not part of the ckptscan package: plain PyTorch on CPU, no dependency on ckptscan.
"""
