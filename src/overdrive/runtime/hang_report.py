"""The text of a hang report (``overdrive.runtime.watchdog``): which ranks and machines did not arrive.

Pure functions over what the watchdog collected: each rank's answer (sequence number, last collective,
stack), the heartbeats of the silent ones, and every rank's place (``{"host", "address", "machine",
"pid"}``). Each returns the report as a dict: ``text`` for stderr, the rest for the launcher's summary.
"""

from __future__ import annotations

from typing import Any

#: the start of the report's one JSON line on stderr, which the launcher finds in the worker's log
REPORT_MARKER = "overdrive-hang-report: "
#: what a collective's error says when another rank's process ended under it (lower case)
PEER_LOSS = ("connection closed by peer", "connection reset by peer", "broken pipe")
#: where a process group's timeout is raised: overdrive's group, and one made outside overdrive (adopted)
RAISE_LIMIT = "overdrive launch --timeout SECONDS, or InitProcessGroupKwargs(timeout=...)"
RAISE_ADOPTED_LIMIT = ("where the group is made: Ray Train's TorchConfig(timeout_s=...), or "
                       "init_process_group(timeout=...)")


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def machines(places: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Machine rank -> ``{"machine", "host", "address", "ranks"}`` from every rank's place."""
    found: dict[int, dict[str, Any]] = {}
    for rank in sorted(places):
        place = places[rank]
        machine = int(place.get("machine", 0))
        entry = found.setdefault(machine, {"machine": machine, "host": place.get("host", "?"),
                                           "address": place.get("address", "?"), "ranks": []})
        entry["ranks"].append(rank)
    return found


def describe_machine(machine: dict[str, Any]) -> str:
    """``machine 1 (host NAME, address ADDR, ranks 2, 3)``."""
    return (f"machine {machine['machine']} (host {machine['host']}, address {machine['address']}, "
            f"{_ranks(machine['ranks'])})")


def _collective(own: dict[str, Any]) -> tuple[str, int]:
    last = own.get("last") or {}
    return str(last.get("name", "a collective")), int(last.get("seq", own.get("seq", -1)))


def hang(rank: int, timeout_s: float, own: dict[str, Any], answers: dict[int, dict[str, Any]],
         seqs: dict[int, int | None], places: dict[int, dict[str, Any]], cause: str = "timeout",
         raise_limit: str = RAISE_LIMIT) -> dict[str, Any]:
    """The report of rank ``rank``, whose collective timed out (``cause`` "timeout") or lost its connection
    to a rank that ended ("lost"): who is behind or silent, the machines none of whose ranks answer, stacks.
    ``raise_limit`` says where the timeout is set."""
    mine = own["seq"]
    world = sorted(seqs)
    behind = [r for r in world if (s := seqs[r]) is not None and s < mine]
    silent = [r for r in world if r not in answers]
    hung = silent if cause == "lost" else behind or silent
    name, seq = _collective(own)
    here = (places.get(rank) or {}).get("machine")
    # a machine none of whose ranks answered: behind a partition, or gone
    lost = [m for m in machines(places).values() if m["machine"] != here and set(m["ranks"]) <= set(silent)]
    if cause == "lost":
        lines = [f"overdrive: rank {rank} lost its connection to another rank in collective #{seq} ({name}); "
                 + (f"{_ranks(hung)} did not answer: their processes ended" if hung else "every rank answered")
                 + "."]
        lines += [f"overdrive: {describe_machine(m)} is lost: none of its ranks answers (its processes ended, "
                  "or the machine went down)." for m in lost]
    else:
        lines = [f"overdrive: hang detected: rank {rank} waited {timeout_s:g} s in collective #{seq} ({name}) "
                 f"and timed out; " + (f"{_ranks(hung)} did not arrive" if hung
                                       else "no rank is behind (a mismatched collective?)") + "."]
        lines += [f"overdrive: {describe_machine(m)} did not answer: it cannot be reached from here (a network "
                  "partition) or it is lost." for m in lost]
    if hung:
        lines.append(f"overdrive: what to do: see below where {_ranks(hung)} {'is' if len(hung) == 1 else 'are'} "
                     f"instead of in {name} (a rank that skipped or reordered a collective, or work that never "
                     f"ends); if that work is only slow, raise the limit: {raise_limit}.")
    # the ranks that did not arrive first: their stacks are the answer, the waiting ranks' come after
    for r in sorted(world, key=lambda r: (r not in hung, r)):
        answer = answers.get(r)
        at = f"issued {seqs[r]} collectives" if seqs[r] is not None else "sent no heartbeat"
        rlast = (answer or {}).get("last") or {}
        doing = f", last #{rlast['seq']} {rlast['name']}" if rlast else ""
        tag = (" <- did not answer" if cause == "lost" else " <- did not arrive") if r in hung else ""
        lines.append(f"-- rank {r}: {at}{doing}{tag}")
        lines.append(answer["stack"] if answer else "  (no answer: its stack, if any, is in its own stderr)")
    return {"text": "\n".join(lines), "waiting_rank": rank, "hung_ranks": hung, "collective": name, "seq": seq,
            "timeout_s": timeout_s, "seqs": {str(r): s for r, s in seqs.items()}, "lost_machines": lost,
            "cause": cause}


def unreachable(rank: int, timeout_s: float, own: dict[str, Any], store_address: str,
                places: dict[int, dict[str, Any]], cause: str = "timeout") -> dict[str, Any]:
    """The report of rank ``rank`` whose collective timed out (or lost a peer) and which cannot reach the
    job's store."""
    name, seq = _collective(own)
    store_host = store_address.rsplit(":", 1)[0]
    found = machines(places)
    here = (places.get(rank) or {}).get("machine")
    main = next((m for m in found.values() if store_host in (m["address"], m["host"]) and m["machine"] != here),
                found.get(0) if here != 0 else None)
    who = describe_machine(main) if main else "the main machine"
    what = f"timed out after {timeout_s:g} s" if cause == "timeout" else "lost its connection to another rank"
    text = (f"overdrive: rank {rank} {what} in collective #{seq} ({name}), and the "
            f"job's store at {store_address} does not answer: this machine cannot reach {who}: a network "
            "partition, or that machine is lost. No hang report can be collected; this rank ends now.")
    return {"text": text, "waiting_rank": rank, "hung_ranks": main["ranks"] if main else [], "collective": name,
            "seq": seq, "timeout_s": timeout_s, "cause": cause, "unreachable": main or {"machine": None, "host": "?",
                                                                          "address": store_host, "ranks": []}}


def stall(rank: int, stall_timeout: float, answers: dict[int, dict[str, Any]], world_size: int,
          places: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The report of a job in which no rank issued a collective for ``stall_timeout`` s: every rank's stack."""
    lines = [f"overdrive: stall detected: no rank issued a collective for {stall_timeout:g} s (--stall_timeout); "
             "every rank waits outside collectives. Where each rank is:"]
    for r in range(world_size):
        answer = answers.get(r)
        place = places.get(r) or {}
        where = f" on {place['host']}" if place.get("host") else ""
        lines.append(f"-- rank {r}{where}: issued {answer['seq']} collectives" if answer
                     else f"-- rank {r}{where}: no answer")
        lines.append(answer["stack"] if answer else "  (its stack, if any, is in its own stderr)")
    return {"text": "\n".join(lines), "waiting_rank": rank, "hung_ranks": [], "collective": None, "seq": None,
            "timeout_s": stall_timeout, "cause": "stall", "silent": [r for r in range(world_size) if r not in answers]}
