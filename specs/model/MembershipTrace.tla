--------------------------- MODULE MembershipTrace ---------------------------
(***************************************************************************)
(* Trace validation of Membership.tla (as etcd-io/raft's Traceetcdraft):   *)
(* the rounds a real job's agents completed, read off their logs, must be  *)
(* a behaviour of the model. Each completed round of the real rendezvous   *)
(* is one element of Trace, in torch's round order:                        *)
(*                                                                         *)
(*   [maps |-> the slot maps logged for it (node -> slot, NoSlot for a     *)
(*             node not of the round): one, or two when two agents marked  *)
(*             the round complete and only one won the store's             *)
(*             compare-and-set,                                            *)
(*    quarantined |-> the nodes that had left quarantined before it,       *)
(*    lost |-> the nodes lost before it (a survivor's log said so)]        *)
(*                                                                         *)
(* Every step is one of Membership's Next; the steps the logs do not show  *)
(* (arrivals, losses, failures, nodes leaving a round) are free, but every *)
(* completed round (round' = round + 1) must be the trace's next one and   *)
(* produce exactly one of its slot maps. The trace is matched when all of  *)
(* it was, and the nodes the run lost, the nodes it quarantined and (when  *)
(* the job succeeded) its outcome are the model's: TraceNotMatched is an   *)
(* invariant whose VIOLATION is the success (TLC stops at the first state  *)
(* that matches; "no error" means no behaviour of the model is this run).  *)
(* Nodes are 1..k in torch's order of node descriptors, so a map is a      *)
(* k-tuple (compared point by point: TLC's \in does not find a function   *)
(* over 1..k in a set of tuples).                                          *)
(***************************************************************************)
EXTENDS Membership

CONSTANTS
    Trace,        \* the completed rounds, as above
    LostNodes,    \* the nodes the run lost (their agents SIGKILLed)
    QuarantinedNodes, \* the nodes that left quarantined (exit 75)
    Succeeded     \* whether the job succeeded (its last round's agents exited 0)

VARIABLE matched  \* how many rounds of Trace the behaviour has matched

traceVars == <<vars, matched>>

TraceInit == Init /\ matched = 0

TraceNext ==
    /\ Next
    /\ IF round' = round + 1
       THEN /\ matched < Len(Trace)
            /\ \E m \in Trace[matched + 1].maps : \A n \in Nodes : slots'[n] = m[n]
            /\ Trace[matched + 1].quarantined \subseteq quarantined
            /\ \A n \in Trace[matched + 1].lost : status[n] = "lost"
            /\ matched' = matched + 1
       ELSE UNCHANGED matched

TraceSpec == TraceInit /\ [][TraceNext]_traceVars

Matched ==
    /\ matched = Len(Trace)
    /\ quarantined = QuarantinedNodes
    /\ {n \in Nodes : status[n] = "lost"} = LostNodes
    /\ Succeeded => outcome = "succeeded"

\* Violated (TLC: "Invariant TraceNotMatched is violated") when the run is a behaviour of the model.
TraceNotMatched == ~Matched
=============================================================================
