"""Tables 4-5 statistics on a hand-built attention tensor (values computed by hand below)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from theory import attention

TOKENS = np.array([5, 5, 7])          # pair (0, 1) stutters, pair (1, 2) does not
SELF = np.array([                      # [heads=2, n=3, n=3], rows sum to 1, no ties
    [[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.7, 0.1]],
    [[0.2, 0.7, 0.1], [0.4, 0.35, 0.25], [0.25, 0.35, 0.4]],
])
CROSS = np.array([                     # [heads=2, n=3, src=3]
    [[0.6, 0.3, 0.1], [0.6, 0.3, 0.1], [0.1, 0.2, 0.7]],
    [[0.9, 0.06, 0.04], [0.06, 0.9, 0.04], [0.0, 0.4, 0.6]],
])


def _cos_dist(p, q):
    return 1 - sum(a * b for a, b in zip(p, q)) / math.sqrt(sum(a * a for a in p) * sum(b * b for b in q))


@pytest.fixture(scope="module")
def rows():
    yes, no = attention.summarize(attention.sentence_pair_stats(SELF, CROSS, TOKENS))
    assert yes["stutter"] and not no["stutter"]
    return yes, no


def test_pairs_split_by_stutter(rows):
    yes, no = rows
    assert yes["pairs"] == 1 and no["pairs"] == 1


def test_self_attention_scores_both_directions(rows):
    yes, no = rows
    # stutter pair (0,1): 0->1 per head [0.3, 0.7], 1->0 per head [0.1, 0.4]
    assert yes["self_min"] == pytest.approx([0.2, 0.1])            # mean/std of {0.3, 0.1}
    assert yes["self_avg"] == pytest.approx([0.375, 0.125])        # of {0.5, 0.25}
    assert yes["self_max"] == pytest.approx([0.55, 0.15])          # of {0.7, 0.4}
    # pair (1,2): 1->2 [0.3, 0.25], 2->1 [0.7, 0.35]
    assert no["self_min"] == pytest.approx([0.3, 0.05])
    assert no["self_avg"] == pytest.approx([0.4, 0.125])
    assert no["self_max"] == pytest.approx([0.5, 0.2])


def test_self_attention_topk_overlap(rows):
    yes, no = rows
    # (0,1): top-1 hits: head1 0->1 and head1 1->0; top-2: all but head0 1->0
    assert yes["self_top1"] == pytest.approx(0.5)
    assert yes["self_top2"] == pytest.approx(0.75)
    # (1,2): top-1 hit only head0 2->1; top-2 misses only head1 1->2 ({0, 1})
    assert no["self_top1"] == pytest.approx(0.25)
    assert no["self_top2"] == pytest.approx(0.75)


def test_cross_attention_distances(rows):
    yes, no = rows
    tv_yes = [0.0, 0.5 * (0.84 + 0.84 + 0.0)]
    assert yes["tv_min"] == pytest.approx([0.0, 0.0])
    assert yes["tv_avg"] == pytest.approx([sum(tv_yes) / 2, 0.0])
    assert yes["tv_max"] == pytest.approx([0.84, 0.0])
    tv_no = [0.5 * (0.5 + 0.1 + 0.6), 0.5 * (0.06 + 0.5 + 0.56)]   # 0.6, 0.56
    assert no["tv_min"][0] == pytest.approx(0.56) and no["tv_max"][0] == pytest.approx(0.6)
    assert no["tv_avg"][0] == pytest.approx(sum(tv_no) / 2)
    cos_yes = [0.0, _cos_dist(CROSS[1, 0], CROSS[1, 1])]
    assert cos_yes[1] == pytest.approx(1 - 0.1096 / 0.8152)
    assert yes["cos_avg"][0] == pytest.approx(sum(cos_yes) / 2, abs=1e-9)
    assert yes["cos_min"][0] == pytest.approx(0.0, abs=1e-9)
    cos_no = [_cos_dist(CROSS[0, 1], CROSS[0, 2]), _cos_dist(CROSS[1, 1], CROSS[1, 2])]
    assert no["cos_max"][0] == pytest.approx(max(cos_no))
    assert no["cos_min"][0] == pytest.approx(min(cos_no))


def test_cross_attention_topk_overlap(rows):
    yes, no = rows
    assert yes["cross_top1"] == pytest.approx(0.5)      # head0 same argmax, head1 not
    assert yes["cross_top2"] == pytest.approx(1.0)
    assert no["cross_top1"] == pytest.approx(0.0)
    assert no["cross_top2"] == pytest.approx(1.0)


def test_pooling_sentences_and_tables():
    one = attention.sentence_pair_stats(SELF, CROSS, TOKENS)
    pooled = attention.concat([one, attention.sentence_pair_stats(SELF[:, ::-1, ::-1], CROSS[:, ::-1], TOKENS[::-1])])
    yes, no = attention.summarize(pooled)
    assert yes["pairs"] == 2 and no["pairs"] == 2
    text = attention.markdown_tables([yes, no])
    assert "Table 4" in text and "Table 5" in text and "yes (2 pairs)" in text


def test_no_stutter_gives_na_row():
    stats = attention.sentence_pair_stats(SELF, CROSS, np.array([4, 5, 6]))
    yes, no = attention.summarize(stats)
    assert yes["pairs"] == 0 and yes["self_avg"] is None and no["pairs"] == 2
    assert "n/a" in attention.markdown_tables([yes, no])
