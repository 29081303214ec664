import sys
from pathlib import Path

# The layout tests import their ground-truth builders as `layout_factories`.
sys.path.insert(0, str(Path(__file__).parent))
