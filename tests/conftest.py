import sys
from pathlib import Path

# tests/fixtures.py (tiny tokenizers and targets built in code) is importable as `fixtures`.
sys.path.insert(0, str(Path(__file__).parent))
