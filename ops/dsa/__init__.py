"""DSA ops (DeepSeek sparse attention): the indexer side (prolog, paged MXFP8 key cache,
Lightning Indexer, exact top-k) and the attention side (MLA latent cache, sparse MLA attention,
fused LI + SFA decode)."""
from k31dsl.ops.dsa.indexer import (PAGE, PAGE_BYTES, indexer_cache_views, indexer_cache_write,  # noqa: F401
                                    indexer_page_views, lightning_indexer, new_indexer_cache)
from k31dsl.ops.dsa.prolog import hadamard_matrix, indexer_prolog  # noqa: F401
from k31dsl.ops.dsa.topk import topk  # noqa: F401
from k31dsl.ops.dsa.attention import mla_cache_write, new_mla_cache, sparse_mla_attention  # noqa: F401
from k31dsl.ops.dsa.slots import slots_of_positions  # noqa: F401
from k31dsl.ops.dsa.fused import fused_li_sfa, li_sfa, li_sfa_unfused  # noqa: F401
