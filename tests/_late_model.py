"""Brute-force model of LateWindowedGroupByKey panes, for the lateness tests.

A transcript is a list of ("add", key, timestamp, value), ("watermark", t)
and ("delay",) steps (every pending AfterLateDelay timer fires). Windows are
fixed, of ``size`` seconds.
"""
from __future__ import annotations

import math


def model_panes(transcript, size, trigger_kind, n_or_offsets, lateness):
    """Expected panes as (key, (start, end), sorted values, is_first, is_last, timing, index)
    and dead letters as (key, value)."""
    wins: dict = {}
    panes, dead = [], []
    watermark = -math.inf
    if trigger_kind == "offsets":
        points = sorted({o for o in n_or_offsets if 0 < o < lateness} | {lateness})
    else:
        points = [lateness]

    def emit(key, w, st, timing, last):
        panes.append((key, w, tuple(sorted(st["values"])), st["index"] == 0, last, timing,
                      st["index"]))
        st["index"] += 1
        st["late"] = 0

    def advance(t):
        for (key, w), st in sorted(wins.items()):
            if st["closed"]:
                continue
            if not st["fired"]:
                if t >= w[1] - 1e-6:
                    st["fired"] = True
                    emit(key, w, st, "ON_TIME", lateness <= 0)
                    if lateness <= 0:
                        st["closed"] = True
                        continue
                else:
                    continue
            while st["next"] < len(points) and w[1] + points[st["next"]] <= t:
                p = points[st["next"]]
                st["next"] += 1
                final = p == lateness
                if st["late"] > 0:
                    emit(key, w, st, "LATE", final)
                if final:
                    st["closed"] = True
                    break

    for step in transcript:
        if step[0] == "watermark":
            watermark = max(watermark, step[1])
            advance(watermark)
        elif step[0] == "delay":
            for (key, w), st in sorted(wins.items()):
                if not st["closed"] and st["fired"] and st["late"] > 0:
                    emit(key, w, st, "LATE", False)
        else:
            _, key, ts, value = step
            start = math.floor(ts / size) * size
            w = (float(start), float(start + size))
            st = wins.setdefault((key, w), {"values": [], "fired": False, "closed": False,
                                            "index": 0, "late": 0, "next": 0})
            if st["closed"]:
                dead.append((key, value))
                continue
            st["values"].append(value)
            if not st["fired"] and watermark >= w[1] - 1e-6:
                # Its end-of-window timer is already due: Beam fires it right
                # after this element's bundle.
                advance(watermark)
            elif st["fired"]:
                st["late"] += 1
                if trigger_kind == "every" and st["late"] >= n_or_offsets:
                    emit(key, w, st, "LATE", False)
    advance(math.inf)
    return sorted(panes), sorted(dead)
