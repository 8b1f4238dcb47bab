"""A teacher and a student that belong together: the same tokenizer, and a student that is the
teacher with some heads removed (`probe prune`), possibly healed before.

    check_pair(teacher_ckpt, student_ckpt)   # one ProbeError naming what differs, else None
"""

from __future__ import annotations

from probe.checkpoint import Checkpoint
from probe.errors import ProbeError

CAUSAL = "causal-lm"


def check_pair(teacher: Checkpoint, student: Checkpoint) -> None:
    """Both are imported causal language models with one vocabulary, and the student's config
    is the teacher's but for the heads it keeps, a subset of the teacher's at every site."""
    for ckpt, role in ((teacher, "--teacher"), (student, "the student")):
        if ckpt.objective != CAUSAL:
            raise ProbeError(
                f"{role} {ckpt.path} is not an imported causal language model (probe import of "
                "a decoder such as Llama or GPT-2), so it has no next-token distribution to "
                "distill."
            )
    _check_vocabulary(teacher, student)
    t_cfg, s_cfg = teacher.model_cfg.to_dict(), student.model_cfg.to_dict()
    differ = [k for k in t_cfg if k != "kept_heads" and t_cfg[k] != s_cfg.get(k)]
    if differ:
        name = differ[0]
        raise ProbeError(
            f"{student.path} is not a pruned copy of the teacher {teacher.path}: their {name} "
            f"differs ({s_cfg.get(name)!r} against {t_cfg[name]!r}); heal a model that "
            "`probe prune` made from the teacher."
        )
    removed = 0
    for t_site, s_site in zip(teacher.model_cfg.sites(), student.model_cfg.sites(), strict=True):
        extra = sorted(set(s_site.kept_heads) - set(t_site.kept_heads))
        if extra:
            raise ProbeError(
                f"{student.path} is not a pruned copy of the teacher {teacher.path}: it keeps "
                f"head {extra[0]} of {s_site.name}, which the teacher does not have."
            )
        removed += len(t_site.kept_heads) - len(s_site.kept_heads)
    if not removed:
        raise ProbeError(
            f"{student.path} keeps every head of the teacher {teacher.path}: nothing was pruned, "
            "so there is nothing to heal; give a model `probe prune` made from the teacher."
        )
    _check_lineage(teacher, student)


# how far a student's token embeddings may be from the teacher's (relative Frobenius distance):
# pruning leaves them as they are and healing moves them a little; another model's are far
LINEAGE = 0.25


def _check_lineage(teacher: Checkpoint, student: Checkpoint) -> None:
    """The student's token embeddings are the teacher's, or close (healed): a model of the same
    shape pruned from another checkpoint is refused."""
    import torch

    t = teacher.model.embed.weight.detach().float()
    s = student.model.embed.weight.detach().to(t.device).float()
    distance = float(torch.linalg.norm(s - t) / torch.linalg.norm(t).clamp_min(1e-12))
    if distance > LINEAGE:
        recorded = [p.get("source") for p in student.meta.get("pruning", []) if
                    isinstance(p, dict)]  # fmt: skip
        origin = f" (it records being pruned from {recorded[0]})" if recorded else ""
        raise ProbeError(
            f"{student.path} was not pruned from the teacher {teacher.path}{origin}: their token "
            f"embeddings differ by {distance:.0%} of the teacher's norm; give the teacher it was "
            "pruned from."
        )


def _check_vocabulary(teacher: Checkpoint, student: Checkpoint) -> None:
    """One tokenizer: the same token for every id (the distributions are compared id by id)."""
    t_vocab, s_vocab = teacher.tokenizer().get_vocab(), student.tokenizer().get_vocab()
    if t_vocab == s_vocab and teacher.model_cfg.vocab_size == student.model_cfg.vocab_size:
        return
    t_ids = {i: tok for tok, i in t_vocab.items()}
    s_ids = {i: tok for tok, i in s_vocab.items()}
    first = next((i for i in sorted(set(t_ids) | set(s_ids)) if t_ids.get(i) != s_ids.get(i)),
                 None)  # fmt: skip
    where = (
        f"id {first} is {t_ids.get(first)!r} for the teacher and {s_ids.get(first)!r} for the "
        "student"
        if first is not None
        else f"{teacher.model_cfg.vocab_size} against {student.model_cfg.vocab_size} rows of "
        "embeddings"
    )
    raise ProbeError(
        f"The teacher {teacher.path} and the student {student.path} have different vocabularies "
        f"({len(t_vocab):,} and {len(s_vocab):,} tokens; {where}); distillation compares "
        "next-token distributions id by id, so both must use one tokenizer."
    )
