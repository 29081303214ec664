import sys
from pathlib import Path

# The experiments package lives at the repository root, beside ckptscan.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
