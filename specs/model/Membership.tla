------------------------------ MODULE Membership ------------------------------
(***************************************************************************)
(* Node membership of one fsm_agent job with spares:                       *)
(* the job needs N nodes (--nnodes N, min = max = N) and more agents may   *)
(* come; the extra ones are spares, waiting in torch's c10d rendezvous for *)
(* the next round. Modelled from:                                           *)
(*                                                                         *)
(* - stable rank slots (fsm_agent/torch/_slots.py): a completed round is   *)
(*   numbered by assign_slots(previous, participants), previous being the  *)
(*   last completed round's map kept on the rendezvous state (written by   *)
(*   the store's compare-and-set, so every node reads the same map);       *)
(* - lost peers (fsm_agent/_core/_peers.py, fsm_agent/torch/_peers.py): a node   *)
(*   whose agent dies is lost for good; its peers' workers fail, the       *)
(*   resilient spec's first rule peer_lost restarts them at once (budget   *)
(*   node_replacements, unlimited) and they re-enter the rendezvous, where *)
(*   a waiting spare joins the new round and takes the lost node's slot;   *)
(* - quarantine: a node whose own workers failed QuarantineAfter times     *)
(*   (failures that followed a peer loss do not count) marks itself        *)
(*   quarantined in the job's store and exits (75); every later join of    *)
(*   that node is refused; its peers treat its leaving as a loss.          *)
(*                                                                         *)
(* What must not happen (NVIDIA/nvidia-resiliency-ext#348): a node fault   *)
(* with a hot spare waiting closes the rendezvous for good and the job     *)
(* dies. The constant WrongVariant selects a deliberately wrong protocol   *)
(* that TLC must reject: "renumber" (torch's own numbering, every round    *)
(* enumerate(sorted(participants))), "close_on_fault" (#348: a             *)
(* re-rendezvous that more than N live agents join closes the rendezvous,  *)
(* "Maximum number of nodes exceeded"), "admit_quarantined" (the join does *)
(* not read the quarantine mark). "none" is the protocol.                  *)
(*                                                                         *)
(* Time is abstract: torch's keep-alive (a lost node is noticed within     *)
(* keep_alive_interval * keep_alive_max_attempt) and the join timeout are  *)
(* not modelled; a join timeout is assumed to outlast a spare's arrival.   *)
(* The store is one reliable service (its loss is JobProtocol.tla's).      *)
(***************************************************************************)
EXTENDS Integers, Sequences, FiniteSets

CONSTANTS
    Nodes,            \* the agents, one per machine: integers, in the order torch sorts
                      \* their node descriptors (assign_slots fills free slots in this order)
    N,                \* the slots a round needs (--nnodes N: min = max = N)
    QuarantineAfter,  \* a node whose own workers failed this often is quarantined
    MaxLosses,        \* machines that may be lost (never to come back)
    MaxFailures,      \* own worker failures, over all the nodes
    WrongVariant      \* "none", "renumber", "close_on_fault" or "admit_quarantined"

Variants == {"none", "renumber", "close_on_fault", "admit_quarantined"}
ASSUME /\ Nodes \subseteq Nat /\ N \in Nat \ {0} /\ N <= Cardinality(Nodes)
       /\ QuarantineAfter \in Nat \ {0} /\ MaxLosses \in Nat /\ MaxFailures \in Nat
       /\ WrongVariant \in Variants

NoSlot == -1
Slots == 0..(N - 1)
Live == {"absent", "waiting", "member"}   \* a node that is, or may still be, of the job

VARIABLES
    status,       \* node -> "absent" (its agent has not started), "waiting" (in the
                  \* rendezvous: a survivor that re-entered, or a spare), "member" (a
                  \* participant of the last completed round, its workers running), "lost"
                  \* (the machine is gone), "quarantined" (it left, exit 75), "done"
    slots,        \* the last completed round's slot map (the rendezvous state's `slots`):
                  \* node -> slot, NoSlot for a node not in that round
    before,       \* ghost: the slot map of the completed round before it
    fails,        \* node -> its own worker failures (not those that followed a peer loss)
    quarantined,  \* the store's quarantine marks: nodes refused for the rest of the job
    closed,       \* the rendezvous is closed for good (torch's state.closed)
    outcome,      \* the job: "running", "succeeded" or "failed"
    round,        \* rounds completed
    losses,       \* machines lost so far
    failures      \* own worker failures so far

vars == <<status, slots, before, fails, quarantined, closed, outcome, round, losses,
          failures>>

-----------------------------------------------------------------------------
(* Stable slots: fsm_agent.torch._slots.assign_slots, line by line.        *)

\* sorted(S): the nodes in increasing order
RECURSIVE Sorted(_)
Sorted(S) == IF S = {} THEN << >>
             ELSE LET m == CHOOSE x \in S : \A y \in S : x <= y
                  IN <<m>> \o Sorted(S \ {m})

Range(f) == {f[n] : n \in DOMAIN f}

\* for node in nodes: a previous slot that is a rank of this round and not taken is kept
RECURSIVE KeepPass(_, _, _, _)
KeepPass(prev, seq, size, acc) ==
    IF seq = << >> THEN acc
    ELSE LET n == Head(seq)
             s == prev[n]
         IN KeepPass(prev, Tail(seq), size,
                     IF s # NoSlot /\ 0 <= s /\ s < size /\ s \notin Range(acc)
                     THEN [acc EXCEPT ![n] = s] ELSE acc)

\* for node in nodes: a node without a slot takes the next free one (free in increasing order)
RECURSIVE FillPass(_, _, _)
FillPass(seq, free, acc) ==
    IF seq = << >> THEN acc
    ELSE LET n == Head(seq)
         IN IF acc[n] # NoSlot THEN FillPass(Tail(seq), free, acc)
            ELSE FillPass(Tail(seq), Tail(free), [acc EXCEPT ![n] = Head(free)])

\* assign_slots(previous, participants), as a map over every node (NoSlot: not a participant)
AssignSlots(prev, parts) ==
    LET nodes == Sorted(parts)
        size == Len(nodes)
        kept == KeepPass(prev, nodes, size, [n \in Nodes |-> NoSlot])
        free == Sorted({r \in 0..(size - 1) : r \notin Range(kept)})
    IN FillPass(nodes, free, kept)

\* torch's own numbering: enumerate(sorted(participants)), every round afresh
TorchSlots(parts) == AssignSlots([n \in Nodes |-> NoSlot], parts)

-----------------------------------------------------------------------------
RoundNodes == {n \in Nodes : slots[n] # NoSlot}      \* the last completed round's nodes
Members == {n \in Nodes : status[n] = "member"}
Waiting == {n \in Nodes : status[n] = "waiting"}
Spares == Waiting \ RoundNodes                        \* waiting, not of the last round
Gone == {n \in Nodes : status[n] \in {"lost", "quarantined"}}
Running == outcome = "running"
\* the round is intact: every node of it is a member, its workers running
Intact == round > 0 /\ \A p \in RoundNodes : status[p] = "member"
EndAll(o) == /\ outcome' = o
             /\ closed' = TRUE
             /\ status' = [n \in Nodes |-> IF status[n] \in Live THEN "done" ELSE status[n]]

Init == /\ status = [n \in Nodes |-> "absent"]
        /\ slots = [n \in Nodes |-> NoSlot]
        /\ before = [n \in Nodes |-> NoSlot]
        /\ fails = [n \in Nodes |-> 0]
        /\ quarantined = {}
        /\ closed = FALSE
        /\ outcome = "running"
        /\ round = 0
        /\ losses = 0
        /\ failures = 0

\* An agent starts and joins the rendezvous: a node of the first round, or a spare (torch's
\* redundancy list while the round is full: not counted by num_nodes_waiting).
Arrive(n) ==
    /\ Running /\ status[n] = "absent"
    /\ status' = [status EXCEPT ![n] = "waiting"]
    /\ UNCHANGED <<slots, before, fails, quarantined, closed, outcome, round, losses,
                   failures>>

\* A round completes: every participant of the last one has left it (torch opens the next
\* round when its participants are gone), and N of the waiting nodes join: any N, in whatever
\* order they reach the store (a survivor may lose the race to a spare). The slots are
\* assign_slots(last completed round's map, participants), or torch's own in "renumber".
Form(S) ==
    /\ Running /\ ~closed /\ Members = {}
    /\ S \subseteq Waiting /\ Cardinality(S) = N
    /\ slots' = IF WrongVariant = "renumber" THEN TorchSlots(S) ELSE AssignSlots(slots, S)
    /\ before' = slots
    /\ round' = round + 1
    /\ status' = [n \in Nodes |-> IF n \in S THEN "member" ELSE status[n]]
    /\ UNCHANGED <<fails, quarantined, closed, outcome, losses, failures>>

\* close_on_fault (#348, not the protocol): a re-rendezvous that more than N live agents join
\* (the faulty node is alive, and the hot spare waits) closes the rendezvous for good.
CloseOnFault ==
    /\ WrongVariant = "close_on_fault"
    /\ Running /\ ~closed /\ Members = {} /\ round > 0
    /\ Cardinality(Waiting) > N
    /\ closed' = TRUE
    /\ UNCHANGED <<status, slots, before, fails, quarantined, outcome, round, losses,
                   failures>>

\* A machine is lost (its agent dies, its keep-alive stops): a member or a spare.
Lose(n) ==
    /\ Running /\ losses < MaxLosses
    /\ status[n] \in {"waiting", "member"}
    /\ status' = [status EXCEPT ![n] = "lost"]
    /\ losses' = losses + 1
    /\ UNCHANGED <<slots, before, fails, quarantined, closed, outcome, round, failures>>

\* A member's own workers fail, in an intact round (a failure after a peer loss is the rule
\* peer_lost's, below, and does not count). Below QuarantineAfter the node restarts into the
\* rendezvous (its peers follow, LeaveRound); at QuarantineAfter it marks itself quarantined in
\* the store and exits (75).
OwnFail(m) ==
    /\ Running /\ Intact /\ failures < MaxFailures
    /\ status[m] = "member"
    /\ fails' = [fails EXCEPT ![m] = @ + 1]
    /\ failures' = failures + 1
    /\ IF fails[m] + 1 >= QuarantineAfter
       THEN /\ status' = [status EXCEPT ![m] = "quarantined"]
            /\ quarantined' = quarantined \cup {m}
       ELSE /\ status' = [status EXCEPT ![m] = "waiting"]
            /\ UNCHANGED quarantined
    /\ UNCHANGED <<slots, before, closed, outcome, round, losses>>

\* A member notices that its round is broken (a peer lost or quarantined: peer_lost, a restart
\* at once within node_replacements; a peer restarting: its workers fail with it, or
\* num_nodes_waiting) and re-enters the rendezvous, its own failure count unchanged.
LeaveRound(m) ==
    /\ Running /\ status[m] = "member"
    /\ \E p \in RoundNodes : status[p] # "member"
    /\ status' = [status EXCEPT ![m] = "waiting"]
    /\ UNCHANGED <<slots, before, fails, quarantined, closed, outcome, round, losses,
                   failures>>

\* A quarantined node's agent is started again and tries to join: the join reads the store's
\* quarantine mark and refuses (the agent exits 75 again), except in "admit_quarantined".
TryRejoin(q) ==
    /\ Running /\ status[q] = "quarantined"
    /\ IF q \in quarantined /\ WrongVariant # "admit_quarantined"
       THEN UNCHANGED vars
       ELSE /\ status' = [status EXCEPT ![q] = "waiting"]
            /\ UNCHANGED <<slots, before, fails, quarantined, closed, outcome, round, losses,
                           failures>>

\* The job fails when fewer than N nodes can ever be had, or when the rendezvous is closed
\* (every join raises RendezvousClosedError); the agents end and close the rendezvous.
JobFails ==
    /\ Running
    /\ closed \/ Cardinality(Nodes \ Gone) < N
    /\ EndAll("failed")
    /\ UNCHANGED <<slots, before, fails, quarantined, round, losses, failures>>

\* The workers of an intact round succeed: the job is over, the agents close the rendezvous
\* (torch's shutdown at the end of the run) and the spares leave.
Succeed ==
    /\ Running /\ ~closed /\ Intact
    /\ EndAll("succeeded")
    /\ UNCHANGED <<slots, before, fails, quarantined, round, losses, failures>>

\* The job is over: nothing more happens (not a deadlock).
Ended == ~Running /\ UNCHANGED vars

NewRound == \E S \in SUBSET Waiting : Form(S)

Next == \/ \E n \in Nodes : Arrive(n) \/ Lose(n) \/ OwnFail(n) \/ LeaveRound(n) \/ TryRejoin(n)
        \/ NewRound
        \/ CloseOnFault \/ JobFails \/ Succeed \/ Ended

\* The agents' own steps are fair (weak fairness); faults, the workers' success and a rejoin
\* attempt are not. A round's forming is written out as WF_vars(NewRound) with its
\* enabledness, FormEnabled, which is ENABLED <<NewRound>>_vars (a
\* subset of N waiting nodes exists; a round changes `round`): TLC's own ENABLED of it made
\* the check twenty times slower (156 s against 7 s, four nodes and one loss).
FormEnabled == Running /\ ~closed /\ Members = {} /\ Cardinality(Waiting) >= N
FormFair == <>[]FormEnabled => []<><<NewRound>>_vars
Fairness == /\ \A n \in Nodes : WF_vars(Arrive(n)) /\ WF_vars(LeaveRound(n))
            /\ FormFair
            /\ WF_vars(JobFails)

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(* What must hold.                                                          *)

TypeOK ==
    /\ status \in [Nodes -> Live \cup {"lost", "quarantined", "done"}]
    /\ slots \in [Nodes -> Slots \cup {NoSlot}] /\ before \in [Nodes -> Slots \cup {NoSlot}]
    /\ fails \in [Nodes -> 0..MaxFailures] /\ quarantined \subseteq Nodes
    /\ closed \in BOOLEAN /\ outcome \in {"running", "succeeded", "failed"}
    /\ round \in Nat /\ losses \in 0..MaxLosses /\ failures \in 0..MaxFailures

\* (a) a completed round's slots are exactly 0..N-1, one node each, and no two live members
\* hold one slot (every member is a node of the last completed round)
SlotsExact ==
    /\ round > 0 => /\ Cardinality(RoundNodes) = N
                    /\ {slots[n] : n \in RoundNodes} = Slots
    /\ Members \subseteq RoundNodes
    /\ \A a, b \in Members : a # b => slots[a] # slots[b]

\* (b) a node of two consecutive completed rounds has the same slot in both
KeepSlots == \A n \in Nodes : before[n] # NoSlot /\ slots[n] # NoSlot => slots[n] = before[n]

\* (d) the rendezvous is closed for good only at the job's success, or when fewer than N nodes
\* that are not lost nor quarantined are left (#348: never because one node failed while a
\* spare waits)
RendezvousOpen == closed => outcome = "succeeded" \/ Cardinality(Nodes \ Gone) < N

\* (e) a quarantined node never waits in the rendezvous nor becomes a member again
QuarantinedStayOut == \A n \in quarantined : status[n] = "quarantined"

\* (c) a slot whose holder was lost or quarantined while a spare waits is held by a member
\* again (the spare's, or a survivor's if the spare lost the race to it), unless fewer than N
\* usable nodes are left
HolderGone(s) == \E n \in RoundNodes : slots[n] = s /\ status[n] \in {"lost", "quarantined"}
Held(s) == \E n \in Members : slots[n] = s
Refill == \A s \in Slots :
    (Running /\ HolderGone(s) /\ Spares # {}) ~> (Held(s) \/ Cardinality(Nodes \ Gone) < N)

=============================================================================
