"""KDA (Kimi Delta Attention) ops, fla shape conventions: gate, chunked prefill (part A, this
helper), decode / rollback / context-parallel summaries (part B)."""
from k31dsl.ops.kda.gate import kda_gate  # noqa: F401
from k31dsl.ops.kda.chunk import chunk_kda  # noqa: F401
from k31dsl.ops.kda.decode import KDAReplay, kda_decode, kda_rollback  # noqa: F401
from k31dsl.ops.kda.cp import kda_cp_merge, kda_cp_summary  # noqa: F401
