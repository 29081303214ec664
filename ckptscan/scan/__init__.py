"""The scan core: checkpoints -> per-layer metrics of (older, newer) pairs.

Data flows one way: readers (bytes -> tensors) -> layouts (tensors -> heads
and routers) -> monitors (math) -> results. No thresholds here: detection
judges the metrics afterwards (`ckptscan.detection.judge`). The loop
is layer-major: for each layer, the checkpoints are visited in step order and
only the previous checkpoint's layer is held, so memory stays at about two
layers' monitored tensors and each checkpoint's bytes are read once. Layers
are independent: an executor (`ckptscan.executors`) runs them as tasks, by
default a couple at once on worker threads (`ckptscan.system.parallel`: one
worker's reads overlap the other's arithmetic), or on a Ray cluster.
Only the monitored tensors' bytes are read, and with `heads` only those
heads' rows of W_q and their KV heads' rows of W_k.

Its stages, in the order a layer passes them: `options` (how metrics are
computed), `selection` (which layers and heads), `reading` (bytes onto the
device), `loading` (checked weights), `comparing` (a pair's result, through
`attention_result` (attention_blocks, attention_results) and `router_result`), and `tasks` (the loop that ties them).
"""

from ckptscan.layouts import HeadOverrides
from ckptscan.scan.options import DEFAULT_TOP_K, SCHEDULING, ScanOptions
from ckptscan.scan.reading import resolve_device
from ckptscan.scan.tasks import LayerTask, scan_layers

__all__ = ["DEFAULT_TOP_K", "SCHEDULING", "HeadOverrides", "LayerTask", "ScanOptions", "resolve_device",
           "scan_layers"]
