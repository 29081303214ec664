import sys
from pathlib import Path

# Tests import the shared checkpoint writers as `factories`.
sys.path.insert(0, str(Path(__file__).parent))
