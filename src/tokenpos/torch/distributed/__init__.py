"""tokenpos.torch.distributed: the token table and its tied cross-entropy split by vocab over ranks, and the
hashed n-gram table split by rows.

Built on ``torch.distributed`` (gloo on CPU, NCCL on GPU); every rank runs the same code (SPMD).

    >>> # torchrun --nproc-per-node 2 script.py
    >>> import torch.distributed as dist
    >>> from tokenpos.torch.distributed import VocabParallelEmbedding, vocab_parallel_cross_entropy
    >>> dist.init_process_group("gloo")
    >>> emb = VocabParallelEmbedding(50257, 768, pad_to_multiple_of=64, seed=0)
    >>> h = emb(ids)                                        # (B, L, D), one all-reduce
    >>> loss = vocab_parallel_cross_entropy(emb.attend(h), targets, vocab_size=emb.vocab_size)

Collectives: forward of the embedding 1, ``attend`` 0 (its backward 1), cross-entropy 3 (its backward 0);
``VocabParallelHashedNgramEmbedding`` forward 1 (2 with the table on the CPU), backward 0; none at world size 1.
"""

from tokenpos.torch.distributed.checkpoint import read_file
from tokenpos.torch.distributed.cross_entropy import vocab_parallel_cross_entropy
from tokenpos.torch.distributed.embedding import VocabParallelEmbedding
from tokenpos.torch.distributed.ngram import VocabParallelHashedNgramEmbedding

__all__ = ["VocabParallelEmbedding", "VocabParallelHashedNgramEmbedding", "read_file", "vocab_parallel_cross_entropy"]
