"""Model building in one home: the shipped pairs (``train-lm-pair``), distilled drafts (``train-draft``) and draft
heads (``train-head``), beside the stages, schedule, checkpoint and card code they share."""
