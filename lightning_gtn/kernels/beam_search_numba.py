"""Numba kernels of the beam search over T o L o G, composed on the fly (one utterance per call).

A hypothesis is ``(word-history hash, trie node, LM state, last frame token, open-word flag)`` with
its acoustic score, its raw LM log-probability, its extra score (word scores, context-graph bonuses, unk
penalties) and a pointer into a table of token records (parent record, token, frame, word), from
which the host reads tokens, frames and words back. Each frame expands every hypothesis by blank,
repeat and new tokens (in lexicon mode only the trie children of its node), merges candidates with
the same full state by log-add (the same word history: the CTC prefix-search merge), prunes those
more than ``beam_threshold`` below the best and keeps the ``beam_size`` best. Every array index is
within bounds by construction (trie, LM and token ids are range-checked by the host first; buffer
sizes are computed from ``beam_size``, the number of tokens and the most words per trie node).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .context_numba import context_step
from .logmath import log_add

NEG_INF = -math.inf
#: "no word end reachable" in :func:`below_kernel`
FAR = 1 << 62
#: history-hash marker of a word boundary in lexicon-free mode
BOUNDARY = -7


@njit(cache=True, nogil=True, inline="always")
def _mix(h, v):
    x = (h ^ (v + 0x2545F4914F6CDD1D)) * 0x100000001B3
    return x ^ (x >> 29)


@njit(cache=True, nogil=True)
def lm_score(state, w, st_off, arc_word, arc_logp, arc_next, bo_logp, bo_state):
    """``(ln P(w | state) with back-off, next state)``; ``(-inf, -1)`` if no state has ``w``."""
    acc = 0.0
    s = state
    S = bo_logp.shape[0]
    steps = 0
    while s >= 0 and s < S and steps <= S:
        lo = st_off[s]
        end = st_off[s + 1]
        hi = end
        while lo < hi:
            mid = (lo + hi) // 2
            if arc_word[mid] < w:
                lo = mid + 1
            else:
                hi = mid
        if lo < end and arc_word[lo] == w:
            return acc + arc_logp[lo], arc_next[lo]
        acc += bo_logp[s]
        s = bo_state[s]
        steps += 1
    return NEG_INF, -1


@njit(cache=True, nogil=True, inline="always")
def _tr(trans, prev, c):
    """ASG's transition score from frame token ``prev`` (-1: the start) to ``c``; ``trans`` is
    ``(C + 1, C)`` (row 0: start scores) or empty (no transitions)."""
    if trans.shape[0] == 0:
        return 0.0
    return trans[prev + 1, c] if prev < 0 else trans[c + 1, prev]


@njit(cache=True, nogil=True)
def smear_kernel(
    ch_off,
    ch_node,
    wd_off,
    wd_id,
    word_lm,
    word_extra,
    has_lm,
    root,
    st_off,
    arc_word,
    arc_logp,
    arc_next,
    bo_logp,
    bo_state,
    lm_weight,
):
    """Per trie node: ``lm_weight`` x the best unigram log-prob of the allowed words below it
    (-inf if none; 0 at the root). Children have larger ids than parents (built so)."""
    N = ch_off.shape[0] - 1
    W = word_lm.shape[0]
    best = np.zeros(W, dtype=np.float64)
    for w in range(W):
        if not word_extra[w] > NEG_INF:
            best[w] = NEG_INF
        elif has_lm:
            lp, _ = lm_score(root, word_lm[w], st_off, arc_word, arc_logp, arc_next, bo_logp, bo_state)
            best[w] = lm_weight * lp
    smear = np.full(N, NEG_INF, dtype=np.float64)
    for n in range(N - 1, -1, -1):
        v = NEG_INF
        for q in range(wd_off[n], wd_off[n + 1]):
            if best[wd_id[q]] > v:
                v = best[wd_id[q]]
        for k in range(ch_off[n], ch_off[n + 1]):
            m = ch_node[k]
            if m > n and smear[m] > v:
                v = smear[m]
        smear[n] = v
    if N > 0:
        smear[0] = 0.0
    return smear


@njit(cache=True, nogil=True)
def below_kernel(ch_off, ch_node, wd_off, wd_id, word_extra):
    """Per trie node n: the fewest tokens after n that end an allowed word strictly below it
    (``FAR`` if none), a lower bound of the frames a hypothesis at n still needs. Children have
    larger ids than parents (built so)."""
    N = ch_off.shape[0] - 1
    end = np.full(N, FAR, dtype=np.int64)  # tokens from n to an allowed word end, n included
    below = np.full(N, FAR, dtype=np.int64)
    for n in range(N - 1, -1, -1):
        v = FAR
        for k in range(ch_off[n], ch_off[n + 1]):
            m = ch_node[k]
            if m > n and end[m] < FAR and end[m] + 1 < v:
                v = end[m] + 1
        below[n] = v
        for q in range(wd_off[n], wd_off[n + 1]):
            if word_extra[wd_id[q]] > NEG_INF:
                v = 0
                break
        end[n] = v
    return below


@njit(cache=True, nogil=True, inline="always")
def _push(ci, ch, cf, n, parent, node, lm, last, inw, tok, word, ctx, hist, ac, lms, ext, total):
    ci[n, 0] = parent
    ci[n, 1] = node
    ci[n, 2] = lm
    ci[n, 3] = last
    ci[n, 4] = inw
    ci[n, 5] = tok
    ci[n, 6] = word
    ci[n, 7] = ctx
    ch[n] = hist
    cf[n, 0] = ac
    cf[n, 1] = lms
    cf[n, 2] = ext
    cf[n, 3] = total
    return n + 1


@njit(cache=True, nogil=True)
def _merge(ci, ch, cf, n, slot, stamp, gen, uniq):
    """Log-adds candidates with equal (hist, node, lm, last, inw, context state); returns the count
    of ``uniq``."""
    mask = slot.shape[0] - 1
    nu = 0
    for i in range(n):
        h = _mix(_mix(_mix(_mix(_mix(ch[i], ci[i, 1]), ci[i, 2]), ci[i, 3]), ci[i, 4]), ci[i, 7])
        p = h & mask
        while True:
            if stamp[p] != gen:
                stamp[p] = gen
                slot[p] = i
                uniq[nu] = i
                nu += 1
                break
            j = slot[p]
            if (
                ch[j] == ch[i]
                and ci[j, 1] == ci[i, 1]
                and ci[j, 2] == ci[i, 2]
                and ci[j, 3] == ci[i, 3]
                and ci[j, 4] == ci[i, 4]
                and ci[j, 7] == ci[i, 7]
            ):
                tot = log_add(cf[j, 3], cf[i, 3])
                ac = log_add(cf[j, 0], cf[i, 0])
                if cf[i, 3] > cf[j, 3]:  # the better one keeps its tokens, frames and LM score
                    for k in range(8):
                        ci[j, k] = ci[i, k]
                    cf[j, 1] = cf[i, 1]
                    cf[j, 2] = cf[i, 2]
                cf[j, 0] = ac
                cf[j, 3] = tot
                break
            p = (p + 1) & mask
    return nu


@njit(cache=True, nogil=True)
def _sift_down(h, root, m):
    """Restores the max-heap ``h[:m]`` below ``root`` (no NaN in it)."""
    while True:
        child = 2 * root + 1
        if child >= m:
            return
        if child + 1 < m and h[child + 1] > h[child]:
            child += 1
        if h[root] >= h[child]:
            return
        h[root], h[child] = h[child], h[root]
        root = child


@njit(cache=True, nogil=True)
def _kth_smallest(a, n, k, heap):
    """The ``k``-th smallest of ``a[:n]`` (``0 <= k < n``, no NaN): the value
    ``np.partition(a[:n], k)[k]`` gives, kept as the largest of a max-heap of the ``k + 1``
    smallest (``heap``: scratch of at least ``k + 1``), ``O(n log k)`` whatever the order of
    ``a``. (Compiled, ``np.partition`` took about 10 s of the beam search's 30 s first-use
    compile.)"""
    m = k + 1
    for i in range(m):
        heap[i] = a[i]
    for root in range(m // 2 - 1, -1, -1):
        _sift_down(heap, root, m)
    for i in range(m, n):
        if a[i] < heap[0]:
            heap[0] = a[i]
            _sift_down(heap, 0, m)
    return heap[0]


@njit(cache=True, nogil=True)
def beam_kernel(
    em,
    T,
    blank,
    rep,
    sep,
    lexfree,
    ch_off,
    ch_tok,
    ch_node,
    wd_off,
    wd_id,
    smear,
    word_lm,
    word_extra,
    tok_lm,
    tok_starts,
    word_score,
    has_lm,
    st_off,
    arc_word,
    arc_logp,
    arc_next,
    bo_logp,
    bo_state,
    lm_start,
    lm_eos,
    lm_weight,
    beam_size,
    beam_threshold,
    token_beam,
    token_min_logp,
    nbest,
    per_hyp,
    trans,
    below,
    complete,
    cx_off,
    cx_tok,
    cx_node,
    cx_fail,
    cx_acc,
    cx_floor,
    cx_next,
    cx_bonus,
    cx_start,
    cx_bound,
    has_ctx,
):
    """Decodes one utterance ``em`` (T_max, C) float32 over its first ``T`` frames.

    ``smear[n]`` is the look-ahead score of trie node n (0 at the root; -inf: no allowed word below),
    added to a partial word's pruning score while it is spelled (flashlight's LM smearing).

    Lexicon mode, ``complete=True``: only hypotheses that can still end a word in the frames left
    (``below[n]``, from :func:`below_kernel`) are kept, and only complete ones are returned: a
    hypothesis that cannot finish never takes the place of one that can. ``complete=False`` (the
    fallback when no complete hypothesis survives) keeps them all and returns the best, open word
    included (its tokens, with no word id).

    Context biasing (``has_ctx``): the context graph's arrays ``cx_*``
    (:mod:`lightning_gtn.kernels.context_numba`; ``cx_next`` / ``cx_bonus`` its dense tables, or
    empty) are walked beside each hypothesis, from state
    ``cx_start``: the tokens of each word, then the boundary symbol ``cx_bound`` at each word's end
    (lexicon mode: each word end; lexicon-free: a separator or a word-starting token after an open
    word, and the end); the bonus goes into the extra score.

    Returns ``(n_out, out_rec, out_f (nbest, 3) [total, acoustic, lm], rec_parent, rec_tok,
    rec_frame, rec_word)``.
    """
    C = em.shape[1]
    dense = cx_next.shape[0] > 0
    K = C if token_beam <= 0 or token_beam > C else token_beam
    cap = beam_size * per_hyp  # per_hyp: the most candidates one hypothesis makes (host-computed)
    tsize = 1
    while tsize < 2 * cap:
        tsize *= 2
    slot = np.zeros(tsize, dtype=np.int64)
    stamp = np.zeros(tsize, dtype=np.int64)
    uniq = np.empty(cap, dtype=np.int64)
    ci = np.empty((cap, 8), dtype=np.int64)  # parent, node, lm, last, inw, tok, word, context
    ch = np.empty(cap, dtype=np.int64)
    cf = np.empty((cap, 4), dtype=np.float64)
    hi = np.empty((beam_size, 6), dtype=np.int64)  # node, lm, last, inw, rec, context
    hh = np.empty(beam_size, dtype=np.int64)
    hf = np.empty((beam_size, 4), dtype=np.float64)  # ac, lms, ext, total
    nrec_cap = T * beam_size + 1
    rec_parent = np.empty(nrec_cap, dtype=np.int64)
    rec_tok = np.empty(nrec_cap, dtype=np.int64)
    rec_frame = np.empty(nrec_cap, dtype=np.int64)
    rec_word = np.empty(nrec_cap, dtype=np.int64)
    nrec = 0
    sc = np.empty(cap, dtype=np.float64)
    heap = np.empty(beam_size, dtype=np.float64)  # scratch of the beam_size-th best score
    allowed = np.ones(C, dtype=np.bool_)
    order = np.empty(0, dtype=np.int64)

    hi[0, 0] = 0
    hi[0, 1] = lm_start
    hi[0, 2] = -1
    hi[0, 3] = 0
    hi[0, 4] = -1
    hi[0, 5] = cx_start
    hh[0] = 0
    hf[0, 0] = 0.0
    hf[0, 1] = 0.0
    hf[0, 2] = 0.0
    hf[0, 3] = 0.0
    nh = 1
    gen = 0
    for t in range(T):
        e = em[t]
        left = T - 1 - t  # frames after this one
        if K < C:
            order = np.argsort(-e)
            allowed[:] = False
            for k in range(K):
                allowed[order[k]] = True
        if token_min_logp > NEG_INF:  # pyctcdecode's rule: tokens below it, except the frame's best
            amax = 0
            for c in range(C):
                if e[c] > e[amax]:
                    amax = c
                if e[c] < token_min_logp:
                    allowed[c] = False
                elif K >= C:
                    allowed[c] = True
            allowed[amax] = True
        n = 0
        for h in range(nh):
            node = hi[h, 0]
            lmst = hi[h, 1]
            last = hi[h, 2]
            inw = hi[h, 3]
            rec = hi[h, 4]
            cst = hi[h, 5]
            hist = hh[h]
            ac = hf[h, 0]
            lms = hf[h, 1]
            ext = hf[h, 2]
            tot = hf[h, 3]
            # staying in a word is kept only if the word can still end (extensions: checked below)
            stay = not (complete and not lexfree and node != 0 and below[node] > left)
            if stay and blank >= 0 and allowed[blank] and e[blank] > NEG_INF:
                n = _push(
                    ci, ch, cf, n, h, node, lmst, blank, inw, -1, -1, cst, hist, ac + e[blank], lms, ext, tot + e[blank]
                )  # (ASG has no blank)
            if stay and last >= 0 and last != blank and allowed[last] and e[last] > NEG_INF:
                n = _push(
                    ci,
                    ch,
                    cf,
                    n,
                    h,
                    node,
                    lmst,
                    last,
                    inw,
                    -1,
                    -1,
                    cst,
                    hist,
                    ac + e[last] + _tr(trans, last, last),
                    lms,
                    ext,
                    tot + e[last] + _tr(trans, last, last),
                )
            prev = rec_tok[rec] if rec >= 0 else -1  # the last token emitted (for ASG's repeat)
            if lexfree:
                for c in range(C):
                    if c == blank or c == last or not allowed[c] or not e[c] > NEG_INF:
                        continue
                    eff = c
                    if c == rep:
                        eff = prev
                        if eff < 0 or eff == sep:
                            continue
                    a2 = ac + e[c] + _tr(trans, last, c)
                    t2 = tot + e[c] + _tr(trans, last, c)
                    if eff == sep:
                        if inw == 0:  # a separator with no open word leaves the text unchanged
                            n = _push(ci, ch, cf, n, h, node, lmst, c, 0, -1, -1, cst, hist, a2, lms, ext, t2)
                            continue
                        h2 = _mix(hist, BOUNDARY)
                        inw2 = 0
                        ext2 = ext
                        cst2 = cst
                        if has_ctx:
                            if dense:  # one lookup (a call here would pass every array's fields)
                                rw = cx_bonus[cst, cx_bound]
                                cst2 = cx_next[cst, cx_bound]
                            else:
                                cst2, rw = context_step(
                                    cx_off, cx_tok, cx_node, cx_fail, cx_acc, cx_floor, cst, cx_bound
                                )
                            ext2 += rw
                    else:
                        h2 = hist
                        ext2 = ext
                        open_word = inw
                        cst2 = cst
                        if tok_starts[eff] and open_word != 0:
                            h2 = _mix(h2, BOUNDARY)
                            open_word = 0
                            if has_ctx:
                                if dense:  # one lookup (a call here would pass every array's fields)
                                    rw = cx_bonus[cst2, cx_bound]
                                    cst2 = cx_next[cst2, cx_bound]
                                else:
                                    cst2, rw = context_step(
                                        cx_off, cx_tok, cx_node, cx_fail, cx_acc, cx_floor, cst2, cx_bound
                                    )
                                ext2 += rw
                        if has_ctx:
                            if dense:  # one lookup (a call here would pass every array's fields)
                                rw = cx_bonus[cst2, eff]
                                cst2 = cx_next[cst2, eff]
                            else:
                                cst2, rw = context_step(cx_off, cx_tok, cx_node, cx_fail, cx_acc, cx_floor, cst2, eff)
                            ext2 += rw
                        if open_word == 0:
                            ext2 += word_score
                        h2 = _mix(h2, eff)
                        inw2 = 1
                    lm2 = lmst
                    lms2 = lms
                    if has_lm:
                        lp, lm2 = lm_score(lmst, tok_lm[eff], st_off, arc_word, arc_logp, arc_next, bo_logp, bo_state)
                        if not lp > NEG_INF:
                            continue
                        lms2 = lms + lp
                    n = _push(
                        ci,
                        ch,
                        cf,
                        n,
                        h,
                        0,
                        lm2,
                        c,
                        inw2,
                        eff,
                        -1,
                        cst2,
                        h2,
                        a2,
                        lms2,
                        ext2,
                        a2 + lm_weight * lms2 + ext2,
                    )
            else:
                if sep >= 0 and node == 0 and sep != last and allowed[sep] and e[sep] > NEG_INF:
                    n = _push(
                        ci,
                        ch,
                        cf,
                        n,
                        h,
                        0,
                        lmst,
                        sep,
                        inw,
                        sep,
                        -1,
                        cst,
                        hist,
                        ac + e[sep] + _tr(trans, last, sep),
                        lms,
                        ext,
                        tot + e[sep] + _tr(trans, last, sep),
                    )
                k0 = ch_off[node]
                k1 = ch_off[node + 1]
                ktry = k1 - k0
                if rep >= 0 and rep != last and prev >= 0 and prev != sep:
                    ktry += 1
                for kk in range(ktry):
                    if kk < k1 - k0:
                        c = ch_tok[k0 + kk]
                        eff = c
                        m = ch_node[k0 + kk]
                    else:  # ASG's repeat token: the previous token again
                        c = rep
                        eff = prev
                        m = -1
                        lo = k0
                        hi2 = k1
                        while lo < hi2:
                            mid = (lo + hi2) // 2
                            if ch_tok[mid] < eff:
                                lo = mid + 1
                            else:
                                hi2 = mid
                        if lo < k1 and ch_tok[lo] == eff:
                            m = ch_node[lo]
                        if m < 0:
                            continue
                    if c >= C or c == blank or c == last or not allowed[c] or not e[c] > NEG_INF:
                        continue
                    if c == rep and eff == c:
                        continue
                    a2 = ac + e[c] + _tr(trans, last, c)
                    cst2 = cst
                    r2 = 0.0
                    if has_ctx:
                        if dense:  # one lookup (a call here would pass every array's fields)
                            r2 = cx_bonus[cst, eff]
                            cst2 = cx_next[cst, eff]
                        else:
                            cst2, r2 = context_step(cx_off, cx_tok, cx_node, cx_fail, cx_acc, cx_floor, cst, eff)
                    if ch_off[m + 1] > ch_off[m] and smear[m] > NEG_INF and (not complete or below[m] <= left):
                        # LM look-ahead: the best word below m, replaced by the real score at the end
                        n = _push(
                            ci,
                            ch,
                            cf,
                            n,
                            h,
                            m,
                            lmst,
                            c,
                            0,
                            eff,
                            -1,
                            cst2,
                            hist,
                            a2,
                            lms,
                            ext + r2,
                            tot + (a2 - ac) + smear[m] - smear[node] + r2,
                        )
                    cst3 = cst2
                    r3 = r2
                    if has_ctx and wd_off[m + 1] > wd_off[m]:  # a word ends: the boundary
                        if dense:  # one lookup (a call here would pass every array's fields)
                            rb = cx_bonus[cst2, cx_bound]
                            cst3 = cx_next[cst2, cx_bound]
                        else:
                            cst3, rb = context_step(cx_off, cx_tok, cx_node, cx_fail, cx_acc, cx_floor, cst2, cx_bound)
                        r3 += rb
                    for q in range(wd_off[m], wd_off[m + 1]):
                        w = wd_id[q]
                        lm2 = lmst
                        lms2 = lms
                        if has_lm:
                            lp, lm2 = lm_score(
                                lmst, word_lm[w], st_off, arc_word, arc_logp, arc_next, bo_logp, bo_state
                            )
                            if not lp > NEG_INF:
                                continue
                            lms2 = lms + lp
                        ext2 = ext + word_extra[w] + r3
                        if not ext2 > NEG_INF:
                            continue
                        n = _push(
                            ci,
                            ch,
                            cf,
                            n,
                            h,
                            0,
                            lm2,
                            c,
                            0,
                            eff,
                            w,
                            cst3,
                            _mix(hist, w),
                            a2,
                            lms2,
                            ext2,
                            a2 + lm_weight * lms2 + ext2,
                        )
        gen += 1
        nu = _merge(ci, ch, cf, n, slot, stamp, gen, uniq)
        best = NEG_INF
        for u in range(nu):
            if cf[uniq[u], 3] > best:
                best = cf[uniq[u], 3]
        if not best > NEG_INF:
            nh = 0
            break
        nk = 0
        for u in range(nu):
            if cf[uniq[u], 3] >= best - beam_threshold:
                uniq[nk] = uniq[u]
                nk += 1
        if nk > beam_size:  # the beam_size best, in candidate order (ties: the first ones)
            for u in range(nk):
                sc[u] = -cf[uniq[u], 3]
            kth = -_kth_smallest(sc, nk, beam_size - 1, heap)
            above = 0
            for u in range(nk):
                if cf[uniq[u], 3] > kth:
                    above += 1
            ties = beam_size - above
            m = 0
            for u in range(nk):
                v = cf[uniq[u], 3]
                if v > kth or (v == kth and ties > 0):
                    if v == kth:
                        ties -= 1
                    uniq[m] = uniq[u]
                    m += 1
            nk = m
        # the new hypotheses (parents are read before any is overwritten: copy via candidates)
        for u in range(nk):
            i = uniq[u]
            prec = hi[ci[i, 0], 4]
            ci[i, 0] = prec
        for u in range(nk):
            i = uniq[u]
            r = ci[i, 0]
            if ci[i, 5] >= 0 and nrec < nrec_cap:
                rec_parent[nrec] = r
                rec_tok[nrec] = ci[i, 5]
                rec_frame[nrec] = t
                rec_word[nrec] = ci[i, 6]
                r = nrec
                nrec += 1
            hi[u, 0] = ci[i, 1]
            hi[u, 1] = ci[i, 2]
            hi[u, 2] = ci[i, 3]
            hi[u, 3] = ci[i, 4]
            hi[u, 4] = r
            hi[u, 5] = ci[i, 7]
            hh[u] = ch[i]
            hf[u, 0] = cf[i, 0]
            hf[u, 1] = cf[i, 1]
            hf[u, 2] = cf[i, 2]
            hf[u, 3] = cf[i, 3]
        nh = nk

    # end of utterance: complete words only (lexicon mode), close the open word, </s>
    n = 0
    for h in range(nh):
        if complete and not lexfree and hi[h, 0] != 0:
            continue
        hist = hh[h]
        lms = hf[h, 1]
        tot = hf[h, 3]
        ext = hf[h, 2]
        cst = hi[h, 5]
        if lexfree and hi[h, 3] != 0:
            hist = _mix(hist, BOUNDARY)
            b = 0.0
            if has_ctx:
                if dense:  # one lookup (a call here would pass every array's fields)
                    rw = cx_bonus[cst, cx_bound]
                    cst = cx_next[cst, cx_bound]
                else:
                    cst, rw = context_step(cx_off, cx_tok, cx_node, cx_fail, cx_acc, cx_floor, cst, cx_bound)
                b += rw
            ext += b
            tot += b
        if has_ctx:  # a pending partial match is given back at the end
            b = cx_floor[cst] - cx_acc[cst]
            ext += b
            tot += b
        if has_lm:
            lp, _ = lm_score(hi[h, 1], lm_eos, st_off, arc_word, arc_logp, arc_next, bo_logp, bo_state)
            if not lp > NEG_INF:
                if complete:
                    continue
                lp = 0.0  # the fallback keeps a hypothesis the LM cannot end
            lms += lp
            tot += lm_weight * lp
        n = _push(ci, ch, cf, n, hi[h, 4], 0, 0, 0, 0, -1, -1, 0, hist, hf[h, 0], lms, ext, tot)
    gen += 1
    nu = _merge(ci, ch, cf, n, slot, stamp, gen, uniq)
    sc = np.empty(nu, dtype=np.float64)
    for u in range(nu):
        sc[u] = -cf[uniq[u], 3]
    top = np.argsort(sc, kind="mergesort")
    n_out = min(nu, nbest)
    out_rec = np.empty(n_out, dtype=np.int64)
    out_f = np.empty((n_out, 3), dtype=np.float64)
    for u in range(n_out):
        i = uniq[top[u]]
        out_rec[u] = ci[i, 0]
        out_f[u, 0] = cf[i, 3]
        out_f[u, 1] = cf[i, 0]
        out_f[u, 2] = cf[i, 1]
    return n_out, out_rec, out_f, rec_parent[:nrec], rec_tok[:nrec], rec_frame[:nrec], rec_word[:nrec]
