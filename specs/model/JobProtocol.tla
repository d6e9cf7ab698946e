----------------------------- MODULE JobProtocol -----------------------------
(***************************************************************************)
(* The job-wide protocol of fsm_agent: N agents of one job (one per node,  *)
(* a fixed --nnodes), the rendezvous store they share (torch's TCPStore),  *)
(* c10d rendezvous rounds, the job-wide restart budget, the job-failed     *)
(* announcement and the exit barrier; agents may crash, leave on a signal  *)
(* and be replaced by a new process that rejoins, and a preemption signal  *)
(* may drain the whole job (a PREEMPTED announcement, same exit code).     *)
(*                                                                         *)
(* Each agent runs the lifecycle of a spec file: the constants Trans,      *)
(* EnterActs, ExitActs, Initial, Final and Scope are generated from        *)
(* specs/<name>.yaml (fsm_agent.testing.protocol_model), so the model      *)
(* interprets the very transitions the engine runs. What the model adds is *)
(* what the torch agent does around the engine: it polls the store for an  *)
(* announcement wherever it waits, acknowledges it, announces when its     *)
(* lifecycle ends in a failure nobody announced, and waits for the others' *)
(* acknowledgements before it exits (so the store host outlives the news). *)
(*                                                                         *)
(* Time is abstract. Polls are assumed to be much shorter than timeouts:   *)
(* a timeout fires only when what it waits for can no longer happen (a     *)
(* node is gone), and never while the announcement it would have read is   *)
(* already in the store and the agent can act on it.                       *)
(*                                                                         *)
(* How an agent reads the announcement while it waits: a watch            *)
(* (fsm_agent._core._job.OutcomeWatch), a thread blocked in a store wait on a   *)
(* connection of its own, which the winning announcement wakes; the        *)
(* agent's waits read what the watch saw. A step of the model that reads  *)
(* ann is the agent reading its watch. What the watch guarantees, and the *)
(* model therefore assumes or checks:                                      *)
(*  - it never fires early: it reports an outcome only once one is in the *)
(*    store (the wake-up keys are set after the outcome's compare_set);    *)
(*    the invariant WatchSound;                                            *)
(*  - it is not lost: a watcher that took its number before the announcer *)
(*    read the count is woken, one that took it after finds the outcome   *)
(*    when it looks before its first wait; and a wait that times out       *)
(*    (spuriously, or because the outcome was written without waking) is  *)
(*    made again after a look at the outcome. A re-arm changes nothing the *)
(*    protocol sees, a stuttering step, so it is not written (a step that  *)
(*    changes no variable would hide deadlocks from TLC);                  *)
(*  - so a waiting agent learns the outcome eventually: no agent exits     *)
(*    with the outcome unread (the invariant WatchDelivers) and every     *)
(*    agent ends (Termination, under fairness, in the liveness runs);      *)
(*  - its delay is one server round trip, short against every timeout, as *)
(*    a poll's was (the Quiet assumption below stands as before).          *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

CONSTANTS
    Agents,         \* the nodes of the job
    MaxRestarts,    \* --max-restarts
    MaxCrashes,     \* agents that may die at any moment (no announcement, no acknowledgement)
    MaxLeaves,      \* agents that may leave on a termination signal while their workers run
    MaxRejoins,     \* new agent processes that may take a crashed or departed node's place
    MaxPreempts,    \* drain signals (drain_on) that may reach a running agent
    Outcomes,       \* how workers may end: a subset of {"failed", "unhealthy", "succeeded",
                    \* "hung"} (hung: no progress, delivered as the spec's own trigger)
    LocalCount,     \* TRUE: the broken variant, each agent counts a job budget by itself
    \* --- the lifecycle, generated from a spec file ---
    Initial,        \* the initial state
    Final,          \* the final states
    Trans,          \* the transitions: [trig, src, dst, g (guards), u (unless), act, aft]
    EnterActs,      \* [state -> actions run on entering it]
    ExitActs,       \* [state -> actions run on leaving it]
    Scope,          \* the spec's budget scope: "agent" or "job"
    FailedFinal,    \* the final states that report FAILED
    CodeActions     \* actions that set the exit code (set_exit_code instances)

None == "none"
Gone == {"crashed", "left", "exit"}
Obs == [failed |-> "failed", unhealthy |-> "unhealthy", succeeded |-> "succeeded",
        hung |-> "hung", run |-> "healthy", none |-> "stopped"]
Rng(s) == {s[i] : i \in DOMAIN s}
\* A preemption's announcement: its exit code is the one every agent ends with; the model only
\* needs to tell it from a failure's.
PreemptCode == "preempted"
Kind(c) == IF c = PreemptCode THEN "PREEMPTED" ELSE "FAILED"

VARIABLES
    proc,      \* the agent process: "run", "end" (lifecycle final), or one of Gone
    st,        \* the lifecycle's state
    todo,      \* what is left of the transition in flight: actions, "@" = the state change
    dst,       \* the destination of the transition in flight
    blk,       \* the blocking action the agent waits in: "no", "rdzv" or "barrier"
    wk,        \* the agent's workers: "none", "run", "failed", "unhealthy", "succeeded"
    rnd,       \* the rendezvous round of the agent's workers (0: none yet)
    used,      \* failure restarts counted by this agent process (agent scope)
    code,      \* the exit code the agent reports on failure: "1" or a CodeActions name
    seen,      \* the agent has read (and acknowledged) the announcement
    sig,       \* a drain signal reached the agent (it takes "preempted" where it can)
    rep,       \* what the agent reported when it exited: <<outcome, exit code>>
    round,     \* the last completed rendezvous round
    members,   \* the agents of that round
    joining,   \* agents waiting in the rendezvous for the next round
    arrived,   \* agents at the exit barrier of the last round
    ann,       \* the store's announcement: None, or the exit code of the failed job
    ledger,    \* the store's restart ledger: rounds whose failure restart was counted
    faults,    \* crashes, leaves and rejoins so far
    restarts,  \* ghost: rounds formed after a round in which something failed
    failing,   \* ghost: something failed in the current round
    stale,     \* ghost: monitor ticks an agent stayed HEALTHY while a peer waited to restart
    slow,      \* ghost: waits an agent did not end although the job was already over
    flaw       \* ghost: the first thing the lifecycle did out of protocol order ("none")

vars == <<proc, st, todo, dst, blk, wk, rnd, used, code, seen, sig, rep, round, members,
          joining, arrived, ann, ledger, faults, restarts, failing, stale, slow, flaw>>

Obsv == {"healthy", "failed", "unhealthy", "succeeded", "stopped", "unknown", "init", "hung"}
Srcs(t) == {Trans[i].src : i \in {j \in DOMAIN Trans : Trans[j].trig \in t}}
Transient == Srcs({"always"})
Observed == Srcs(Obsv)
Timed == Srcs({"timeout"})
Draining == Srcs({"drained"})
Cands(s, t) == {i \in DOMAIN Trans : Trans[i].src = s /\ Trans[i].trig = t}

JobCount == Scope = "job" /\ ~LocalCount
HasLeft(a) == IF JobCount THEN rnd[a] \in ledger \/ Cardinality(ledger) < MaxRestarts
                          ELSE used[a] < MaxRestarts
Waiting(a) == joining \ {a} # {}
Known == {"has_restarts_left", "nodes_waiting"}
GV(a, g) == IF g = "has_restarts_left" THEN HasLeft(a) ELSE Waiting(a)
\* Guards the model does not know (failure-policy matchers) may take either value.
Holds(a, i) == /\ \A g \in Trans[i].g : g \in Known => GV(a, g)
               /\ \A g \in Trans[i].u : g \in Known => ~GV(a, g)
Plan(i) == Trans[i].act
           \o (IF Trans[i].dst = Trans[i].src THEN << >>
               ELSE ExitActs[Trans[i].src] \o <<"@">> \o EnterActs[Trans[i].dst])
           \o Trans[i].aft
Accepts(a, t) == \E i \in Cands(st[a], t) : Holds(a, i)
JobOver == ann # None
\* The agent owes its lifecycle a preemption (its own signal, or the job's announcement) and
\* rests in a state that takes it: it comes before anything else the agent would do.
Pre(a) == (sig[a] \/ ann = PreemptCode) /\ Accepts(a, "preempted")
\* A wait that ends with the job already over counts as too long, except the drain's own.
Late(a) == IF ann # None /\ st[a] \notin Draining THEN 1 ELSE 0

\* Take an enabled transition on trigger t (several only when an unknown guard decides).
Fire(a, t) == \E i \in Cands(st[a], t) :
                /\ Holds(a, i)
                /\ todo' = [todo EXCEPT ![a] = Plan(i)]
                /\ dst' = [dst EXCEPT ![a] = Trans[i].dst]

\* An action raised or no transition was enabled: the engine moves to UNKNOWN, and the torch
\* agent, catching the error, announces the failure before anything else.
Fault(a) == /\ st' = [st EXCEPT ![a] = "UNKNOWN"]
            /\ todo' = [todo EXCEPT ![a] = << >>]
            /\ blk' = [blk EXCEPT ![a] = "no"]
            /\ joining' = joining \ {a}

Pop(a) == todo' = [todo EXCEPT ![a] = Tail(@)]

\* The first announcement wins (compare_set on an absent key); the announcer has read it.
Announce(a, c) == /\ ann' = IF ann = None THEN c ELSE ann
                  /\ seen' = [seen EXCEPT ![a] = TRUE]

Error(a) == Fault(a) /\ Announce(a, code[a])


\* --- the agent -------------------------------------------------------------------------

\* A monitor tick in an observed state; the poll of the store comes first.
Tick(a) ==
    /\ proc[a] = "run" /\ todo[a] = << >> /\ st[a] \in Observed
    /\ IF Pre(a)
       THEN /\ Fire(a, "preempted")
            /\ seen' = [seen EXCEPT ![a] = @ \/ ann # None]
            /\ UNCHANGED <<st, blk, joining, ann, stale, slow, flaw>>
       ELSE IF ann # None /\ Accepts(a, "job_failed")
       THEN /\ Fire(a, "job_failed")
            /\ seen' = [seen EXCEPT ![a] = TRUE]
            /\ UNCHANGED <<st, blk, joining, ann, stale, slow, flaw>>
       ELSE LET t == Obs[wk[a]] IN
            \* a tick that reads the announcement (or follows a drain signal) and cannot act
            \* on it is a wait too long
            /\ slow' = slow + (IF ann # None \/ sig[a] THEN 1 ELSE 0)
            /\ IF Accepts(a, t)
               THEN \E i \in Cands(st[a], t) :
                     /\ Holds(a, i)
                     /\ todo' = [todo EXCEPT ![a] = Plan(i)]
                     /\ dst' = [dst EXCEPT ![a] = Trans[i].dst]
                     /\ stale' = [stale EXCEPT ![a] = @ + (IF t = "healthy" /\ Waiting(a)
                                                           /\ Trans[i].dst = st[a] THEN 1 ELSE 0)]
                     /\ seen' = [seen EXCEPT ![a] = @ \/ ann # None]
                     /\ UNCHANGED <<st, blk, joining, ann>>
               ELSE Error(a) /\ UNCHANGED <<dst, stale, flaw>>
    /\ UNCHANGED <<proc, wk, rnd, used, code, sig, rep, round, members, arrived, ledger,
                   faults, restarts, failing, flaw>>

\* Leave INIT (the poll first: a late or new agent of a failed job never starts), take an
\* eventless transition, or wait out a timer (BACKOFF), interruptible by the announcement.
Idle(a) ==
    /\ proc[a] = "run" /\ todo[a] = << >> /\ st[a] \notin Observed /\ st[a] \notin Final
    /\ seen' = [seen EXCEPT ![a] = @ \/ ann # None]
    /\ \/ Pre(a) /\ Fire(a, "preempted") /\ UNCHANGED slow
       \/ /\ ~Pre(a)
          /\ ann # None /\ Accepts(a, "job_failed") /\ Fire(a, "job_failed") /\ UNCHANGED slow
       \/ /\ ~Pre(a) /\ ~(ann # None /\ Accepts(a, "job_failed"))
          /\ \/ st[a] \in Transient /\ Fire(a, "always") /\ UNCHANGED slow
             \* every worker has exited during a drain
             \/ /\ st[a] \in Draining /\ wk[a] \notin {"run", "draining"}
                /\ Fire(a, "drained") /\ UNCHANGED slow
             \* starting, or waiting out a timer, in a job known to be over
             \/ /\ st[a] = Initial /\ Fire(a, "start")
                /\ slow' = slow + Late(a)
             \/ /\ st[a] \in Timed /\ Fire(a, "timeout")
                /\ slow' = slow + Late(a)
    /\ UNCHANGED <<proc, st, blk, wk, rnd, used, code, sig, rep, round, members, joining,
                   arrived, ann, ledger, faults, restarts, failing, stale, flaw>>

\* The engine's reaction to an announcement read inside an action: before the state change
\* the action raises and the machine takes job_failed from its source state; an entry action
\* of a final state (the exit barrier) just ends early.
InFinalEnter(a) == st[a] \in Final /\ "@" \notin Rng(todo[a])
CanInterrupt(a) == InFinalEnter(a) \/ Accepts(a, "job_failed") \/ Pre(a)
Interrupt(a) == /\ blk' = [blk EXCEPT ![a] = "no"]
                /\ IF InFinalEnter(a) THEN Pop(a) /\ UNCHANGED dst
                   ELSE IF Pre(a) THEN Fire(a, "preempted")
                   ELSE Fire(a, "job_failed")

\* The actions of the transition in flight run one after the other; the model runs every
\* action up to the next one that waits (rendezvous, exit barrier) as one step. Guards are
\* evaluated in an earlier step (Fire), so the race between a guard and consume_restart stays.
Blocking == {"rendezvous", "exit_barrier"}
Apply(a, x, v) ==
    CASE x = "@" -> [v EXCEPT !.st = dst[a]]
      [] x = "start_workers" -> [v EXCEPT !.wk = "run"]
      [] x = "stop_workers" ->
           [v EXCEPT !.wk = "none",
                     !.flaw = IF dst[a] \in FailedFinal /\ v.ann = None /\ @ = "none"
                              THEN "stopped the workers before announcing" ELSE @]
      [] x = "announce_failure" ->
           [v EXCEPT !.ann = IF v.ann = None THEN v.code ELSE v.ann, !.seen = TRUE]
      [] x = "consume_restart" ->
           IF ~JobCount THEN [v EXCEPT !.used = @ + 1]
           \* counted once per failed round: a second agent of the round rides along
           ELSE IF rnd[a] \in v.ledger \/ Cardinality(v.ledger) < MaxRestarts
           THEN [v EXCEPT !.ledger = @ \cup {rnd[a]}]
           \* another round took the last restart since the guard: the budget is spent,
           \* announce it and end as the announcement says
           ELSE [v EXCEPT !.ann = IF v.ann = None THEN v.code ELSE v.ann, !.seen = TRUE,
                          !.halt = TRUE]
      [] x \in CodeActions -> [v EXCEPT !.code = x]
      \* a drain: settle the preemption's exit code (the job's, if it has one already) and
      \* announce it; signal the workers; kill what is left when the drain's time is up
      [] x = "announce_preemption" ->
           LET c == IF v.ann = None THEN PreemptCode ELSE v.ann
           IN [v EXCEPT !.ann = c, !.code = c, !.seen = TRUE]
      [] x = "drain_workers" -> [v EXCEPT !.wk = IF @ = "run" THEN "draining" ELSE @]
      [] x = "kill_workers" -> [v EXCEPT !.wk = "none"]
      \* a node that failed its health checks leaves the job: it neither fails it nor reports
      [] x = "leave_job" -> [v EXCEPT !.left = TRUE]
      [] OTHER -> v   \* raise_failure and others without effect on the protocol
RECURSIVE Exec(_, _, _)
Exec(a, s, v) ==
    IF s = << >> \/ Head(s) \in Blocking \/ v.halt THEN [v EXCEPT !.rest = s]
    ELSE Exec(a, Tail(s), Apply(a, Head(s), v))

Step(a) ==
    /\ proc[a] = "run" /\ todo[a] # << >> /\ blk[a] = "no"
    /\ CASE Head(todo[a]) = "rendezvous" ->
              /\ blk' = [blk EXCEPT ![a] = "rdzv"]
              /\ joining' = joining \cup {a}
              /\ UNCHANGED <<proc, st, todo, dst, wk, used, code, seen, arrived, ann, ledger,
                             flaw>>
         [] Head(todo[a]) = "exit_barrier" ->
              /\ blk' = [blk EXCEPT ![a] = "barrier"]
              /\ arrived' = arrived \cup {a}
              /\ UNCHANGED <<proc, st, todo, dst, wk, used, code, seen, joining, ann, ledger,
                             flaw>>
         [] Head(todo[a]) = "!job_failed" ->   \* the budget was spent under consume_restart
              /\ IF Accepts(a, "job_failed")
                 THEN Fire(a, "job_failed") /\ UNCHANGED <<st, blk, joining, ann, seen>>
                 ELSE Fault(a) /\ UNCHANGED <<dst, ann, seen>>
              /\ UNCHANGED <<proc, wk, used, code, arrived, ledger, flaw>>
         [] OTHER ->
              LET v == Exec(a, todo[a], [st |-> st[a], wk |-> wk[a], code |-> code[a],
                                         ann |-> ann, seen |-> seen[a], ledger |-> ledger,
                                         used |-> used[a], halt |-> FALSE, rest |-> << >>,
                                         flaw |-> flaw, left |-> FALSE])
              IN /\ st' = [st EXCEPT ![a] = v.st]
                 /\ wk' = [wk EXCEPT ![a] = v.wk]
                 /\ code' = [code EXCEPT ![a] = v.code]
                 /\ seen' = [seen EXCEPT ![a] = v.seen]
                 /\ used' = [used EXCEPT ![a] = v.used]
                 /\ ann' = v.ann
                 /\ ledger' = v.ledger
                 /\ todo' = [todo EXCEPT ![a] = IF v.halt THEN <<"!job_failed">>
                                                ELSE IF v.left THEN << >> ELSE v.rest]
                 /\ flaw' = v.flaw
                 /\ proc' = [proc EXCEPT ![a] = IF v.left THEN "left" ELSE @]
                 /\ UNCHANGED <<dst, blk, joining, arrived>>
    /\ UNCHANGED <<rnd, sig, rep, round, members, faults, restarts, failing, stale, slow>>

\* Waiting in the rendezvous: the poll reads the announcement, or finds that a node of the
\* last round has already reached its exit barrier (the round to come can never complete:
\* the agent announces the failure itself and ends as the announcement says).
RdzvPoll(a) ==
    /\ proc[a] = "run" /\ blk[a] = "rdzv"
    /\ \/ ann # None
       \/ arrived # {}
       \/ Pre(a)
    \* a preemption of its own announces nothing here: the drain's entry does
    /\ IF Pre(a) THEN seen' = [seen EXCEPT ![a] = @ \/ ann # None] /\ UNCHANGED ann
       ELSE Announce(a, "1")
    /\ joining' = joining \ {a}
    /\ IF CanInterrupt(a)
       THEN Interrupt(a) /\ UNCHANGED <<st, flaw>>
       \* the engine cannot redirect the action: it is a fault (UNKNOWN)
       ELSE /\ st' = [st EXCEPT ![a] = "UNKNOWN"]
            /\ todo' = [todo EXCEPT ![a] = << >>]
            /\ blk' = [blk EXCEPT ![a] = "no"]
            /\ flaw' = IF flaw = "none" THEN "job_failed unhandled" ELSE flaw
            /\ UNCHANGED dst
    /\ UNCHANGED <<proc, wk, rnd, used, code, sig, rep, round, members, arrived, ledger,
                   faults, restarts, failing, stale, slow>>

\* Every node of --nnodes has joined: the round completes.
Form ==
    /\ joining = Agents
    /\ round' = round + 1
    /\ members' = joining
    /\ rnd' = [a \in Agents |-> round + 1]
    /\ todo' = [a \in Agents |-> Tail(todo[a])]
    /\ blk' = [a \in Agents |-> "no"]
    /\ joining' = {}
    /\ arrived' = {}
    /\ restarts' = restarts + (IF failing THEN 1 ELSE 0)
    /\ failing' = FALSE
    /\ UNCHANGED <<proc, st, dst, wk, used, code, seen, sig, rep, ann, ledger, faults, stale, slow,
                   flaw>>

\* Timeouts are long and polls short: no timeout fires while a poll is about to announce.
Quiet == ~\E b \in Agents : ENABLED RdzvPoll(b)

RdzvTimeout(a) ==
    /\ proc[a] = "run" /\ blk[a] = "rdzv"
    \* a node that has not joined is gone: the round cannot complete
    /\ \E b \in Agents \ joining : proc[b] \in Gone
    /\ Quiet
    /\ ~(ann # None /\ CanInterrupt(a))
    /\ slow' = slow + (IF JobOver THEN 1 ELSE 0)
    /\ Error(a)
    /\ UNCHANGED <<proc, dst, wk, rnd, used, code, sig, rep, round, members, arrived,
                   ledger, faults, restarts, failing, stale, flaw>>

\* At the exit barrier: everyone arrived, or the announcement ends the wait, or a timeout.
Barrier(a) ==
    /\ proc[a] = "run" /\ blk[a] = "barrier"
    /\ \/ members \subseteq arrived /\ UNCHANGED <<seen, slow, flaw>>
       \/ ann # None /\ seen' = [seen EXCEPT ![a] = TRUE] /\ UNCHANGED slow
       \* every node still missing is gone (the exit barrier's timeout is assumed to outlast
       \* the time a live peer needs to finish, see docs/job-protocol.md)
       \/ /\ ann = None /\ Quiet /\ \A b \in members \ arrived : proc[b] \in Gone
          /\ UNCHANGED seen
          /\ slow' = slow + (IF JobOver THEN 1 ELSE 0)
    /\ blk' = [blk EXCEPT ![a] = "no"]
    /\ Pop(a)
    /\ UNCHANGED <<proc, st, dst, wk, rnd, used, code, sig, rep, round, members, joining,
                   arrived, ann, ledger, faults, restarts, failing, stale, flaw>>

\* The lifecycle is final: the agent's own epilogue (fsm_agent.torch).
Settle(a) ==
    /\ proc[a] = "run" /\ todo[a] = << >> /\ st[a] \in Final
    /\ proc' = [proc EXCEPT ![a] = "end"]
    /\ UNCHANGED <<st, todo, dst, blk, wk, rnd, used, code, seen, sig, rep, round, members,
                   joining, arrived, ann, ledger, faults, restarts, failing, stale, slow, flaw>>

Linger(a) ==
    /\ proc[a] = "end"
    /\ \/ /\ ann = None /\ st[a] # "SUCCEEDED"   \* a failure nobody announced (action error)
          /\ Announce(a, code[a])
          /\ UNCHANGED <<proc, rep>>
       \/ /\ ann # None /\ ~seen[a]
          /\ seen' = [seen EXCEPT ![a] = TRUE]
          /\ UNCHANGED <<proc, rep, ann>>
       \/ /\ ann = None /\ st[a] = "SUCCEEDED"
          /\ proc' = [proc EXCEPT ![a] = "exit"]
          /\ rep' = [rep EXCEPT ![a] = <<"SUCCEEDED", "0">>]
          /\ UNCHANGED <<seen, ann>>
       \/ /\ ann # None /\ seen[a]
          \* every live peer has read the announcement: the store may go now
          /\ \A b \in Agents \ {a} : seen[b] \/ proc[b] \in Gone
          /\ proc' = [proc EXCEPT ![a] = "exit"]
          /\ rep' = [rep EXCEPT ![a] = <<Kind(ann), ann>>]
          /\ UNCHANGED <<seen, ann>>
    /\ UNCHANGED <<st, todo, dst, blk, wk, rnd, used, code, sig, round, members, joining,
                   arrived, ledger, faults, restarts, failing, stale, slow, flaw>>

\* Wherever it waits, the agent reads its watch and acknowledges the announcement the watch
\* saw, even where its lifecycle cannot act on it.
Ack(a) ==
    /\ proc[a] = "run" /\ ann # None /\ ~seen[a]
    /\ seen' = [seen EXCEPT ![a] = TRUE]
    /\ UNCHANGED <<proc, st, todo, dst, blk, wk, rnd, used, code, sig, rep, round, members,
                   joining, arrived, ann, ledger, faults, restarts, failing, stale, slow, flaw>>

Agent(a) == Ack(a) \/ Tick(a) \/ Idle(a) \/ Step(a) \/ RdzvPoll(a) \/ Barrier(a) \/ Settle(a) \/ Linger(a)

\* --- the environment ---------------------------------------------------------------------

\* Workers succeed only together: one SPMD job, whose ranks cannot finish while a peer's
\* workers failed or are gone.
CanSucceed == ~failing /\ \A m \in members : proc[m] \in {"run", "end"}
                                          /\ wk[m] \in {"run", "succeeded"}
WorkersEnd(a) ==
    /\ proc[a] = "run" /\ wk[a] = "run"
    /\ \E o \in Outcomes \ (IF CanSucceed THEN {} ELSE {"succeeded"}) :
         /\ wk' = [wk EXCEPT ![a] = o]
         /\ failing' = (failing \/ o # "succeeded")
    /\ UNCHANGED <<proc, st, todo, dst, blk, rnd, used, code, seen, sig, rep, round, members,
                   joining, arrived, ann, ledger, faults, restarts, stale, slow, flaw>>

\* Drained workers exit (checkpointed: with 0 or not, it does not matter), or never do.
DrainEnd(a) ==
    /\ proc[a] = "run" /\ wk[a] = "draining"
    /\ wk' = [wk EXCEPT ![a] = "drained"]
    /\ UNCHANGED <<proc, st, todo, dst, blk, rnd, used, code, seen, sig, rep, round, members,
                   joining, arrived, ann, ledger, faults, restarts, failing, stale, slow, flaw>>

\* A drain signal (Slurm's preemption, a Kubernetes eviction) reaches an agent at rest or in a
\* rendezvous, in a lifecycle that handles it; elsewhere it is torch's termination (Leave).
Preempt(a) ==
    /\ proc[a] = "run" /\ ~sig[a] /\ faults.preempt < MaxPreempts
    /\ "preempted" \in {Trans[i].trig : i \in DOMAIN Trans}
    /\ st[a] \notin Final /\ (todo[a] = << >> \/ blk[a] = "rdzv")
    /\ sig' = [sig EXCEPT ![a] = TRUE]
    /\ faults' = [faults EXCEPT !.preempt = @ + 1]
    /\ UNCHANGED <<proc, st, todo, dst, blk, wk, rnd, used, code, seen, rep, round, members,
                   joining, arrived, ann, ledger, restarts, failing, stale, slow, flaw>>

\* A job-budget agent that leaves a running round counts the failure restart it causes.
Claim(r) ==
    IF ~JobCount \/ r \in ledger THEN UNCHANGED <<ledger, ann>>
    ELSE IF Cardinality(ledger) < MaxRestarts
    THEN ledger' = ledger \cup {r} /\ UNCHANGED ann
    ELSE /\ ann' = (IF ann = None THEN "1" ELSE ann)
         /\ UNCHANGED ledger

Crash(a) ==
    /\ proc[a] \in {"run", "end"} /\ faults.crash < MaxCrashes
    /\ proc' = [proc EXCEPT ![a] = "crashed"]
    /\ wk' = [wk EXCEPT ![a] = "none"]
    /\ joining' = joining \ {a}
    /\ failing' = (failing \/ (a \in members /\ wk[a] = "run"))
    /\ faults' = [faults EXCEPT !.crash = @ + 1]
    /\ UNCHANGED <<st, todo, dst, blk, rnd, used, code, seen, sig, rep, round, members, arrived,
                   ann, ledger, restarts, stale, slow, flaw>>

Leave(a) ==
    /\ proc[a] = "run" /\ wk[a] = "run" /\ faults.leave < MaxLeaves
    /\ proc' = [proc EXCEPT ![a] = "left"]
    /\ wk' = [wk EXCEPT ![a] = "none"]
    /\ failing' = TRUE
    /\ faults' = [faults EXCEPT !.leave = @ + 1]
    /\ Claim(rnd[a])
    /\ UNCHANGED <<st, todo, dst, blk, rnd, used, code, seen, sig, rep, round, members, joining,
                   arrived, restarts, stale, slow, flaw>>

\* A new agent process for a node whose agent crashed or left. With a job budget it finds its
\* node among the members of the running round: the round failed, and it counts that first.
Rejoin(a) ==
    /\ proc[a] \in {"crashed", "left"} /\ faults.rejoin < MaxRejoins
    \* a replacement joins a running job: nobody has reached a final state yet
    /\ arrived = {}
    /\ \A b \in Agents : proc[b] \in {"run", "crashed", "left"} /\ (proc[b] = "run" => st[b] \notin Final)
    /\ proc' = [proc EXCEPT ![a] = "run"]
    /\ st' = [st EXCEPT ![a] = Initial]
    /\ todo' = [todo EXCEPT ![a] = << >>]
    /\ blk' = [blk EXCEPT ![a] = "no"]
    /\ rnd' = [rnd EXCEPT ![a] = 0]
    /\ used' = [used EXCEPT ![a] = 0]
    /\ code' = [code EXCEPT ![a] = "1"]
    /\ seen' = [seen EXCEPT ![a] = FALSE]
    /\ sig' = [sig EXCEPT ![a] = FALSE]
    /\ faults' = [faults EXCEPT !.rejoin = @ + 1]
    /\ IF a \in members THEN Claim(round) ELSE UNCHANGED <<ledger, ann>>
    /\ UNCHANGED <<dst, wk, rep, round, members, joining, arrived, restarts, failing, stale,
                   slow, flaw>>

Env == \E a \in Agents : WorkersEnd(a) \/ DrainEnd(a) \/ Crash(a) \/ Leave(a) \/ Rejoin(a)
                        \/ RdzvTimeout(a) \/ Preempt(a)

Init ==
    /\ proc = [a \in Agents |-> "run"]
    /\ st = [a \in Agents |-> Initial]
    /\ todo = [a \in Agents |-> << >>]
    /\ dst = [a \in Agents |-> Initial]
    /\ blk = [a \in Agents |-> "no"]
    /\ wk = [a \in Agents |-> "none"]
    /\ rnd = [a \in Agents |-> 0]
    /\ used = [a \in Agents |-> 0]
    /\ code = [a \in Agents |-> "1"]
    /\ seen = [a \in Agents |-> FALSE]
    /\ sig = [a \in Agents |-> FALSE]
    /\ rep = [a \in Agents |-> None]
    /\ round = 0
    /\ members = {}
    /\ joining = {}
    /\ arrived = {}
    /\ ann = None
    /\ ledger = {}
    /\ faults = [crash |-> 0, leave |-> 0, rejoin |-> 0, preempt |-> 0]
    /\ restarts = 0
    /\ failing = FALSE
    /\ stale = [a \in Agents |-> 0]
    /\ slow = 0
    /\ flaw = "none"

\* Every agent has ended: the job is over (not a deadlock).
Done == \A a \in Agents : proc[a] \in Gone /\ UNCHANGED vars

Next == (\E a \in Agents : Agent(a)) \/ Form \/ Env \/ Done

Fairness ==
    /\ \A a \in Agents : WF_vars(Agent(a)) /\ WF_vars(WorkersEnd(a)) /\ WF_vars(RdzvTimeout(a))
    /\ WF_vars(Form)

Spec == Init /\ [][Next]_vars /\ Fairness

\* --- what must hold ----------------------------------------------------------------------

\* The job-wide budget is never exceeded: failure restarts of the whole job, counted once.
JobBudget == Scope = "job" => restarts <= MaxRestarts
\* With a per-agent budget, each agent process stays within its own.
AgentBudget == \A a \in Agents : used[a] <= MaxRestarts
\* Every agent that ends reports the same outcome and exit code.
Agreement == \A a, b \in Agents : rep[a] # None /\ rep[b] # None => rep[a] = rep[b]
\* No agent stays HEALTHY (observing its workers as healthy) while a peer waits to restart.
NoStaleHealthy == \A a \in Agents : stale[a] = 0
\* No agent waits on for a job that is already over: it never waits out a timeout, ignores
\* the announcement on a monitor tick, or starts (or waits out a backoff) after it.
PromptEnd == slow = 0
\* An agent never rests in a failure state before the failure is announced, and giving up
\* announces before it stops the workers (which may take the whole shutdown timeout).
FailureAnnounced == /\ \A a \in Agents :
                        proc[a] \in {"run", "end"} /\ st[a] \in Final \ {"SUCCEEDED"}
                          => ann # None
                    /\ flaw # "stopped the workers before announcing"
\* An agent that reads the announcement inside an action ends through job_failed (the state it
\* waits in has that transition), not through an error.
JobFailedHandled == flaw # "job_failed unhandled"
\* When a lifecycle has ended, its workers are not running any more (nor draining).
StoppedAtEnd == \A a \in Agents : proc[a] \in {"end", "exit"} => wk[a] \notin {"run", "draining"}
\* A preempted agent never ends as a success: workers that exit 0 in a drain have only
\* checkpointed. And a preempted job ends as one: every agent reports PREEMPTED (Agreement).
DrainNotSuccess == /\ \A a \in Agents : sig[a] /\ proc[a] \in {"end", "exit"} => st[a] # "SUCCEEDED"
                   /\ \A a \in Agents : rep[a] # None /\ ann = PreemptCode
                                          => rep[a] = <<"PREEMPTED", PreemptCode>>
\* Every agent reaches an end: it exits, or its process is gone (under fairness).
Termination == <>(\A a \in Agents : proc[a] \in Gone)
\* A watch reports an outcome only once it is in the store: an agent that has read (and
\* acknowledged) the announcement read one that exists.
WatchSound == \A a \in Agents : seen[a] => ann # None
\* A watch is never lost: no agent exits with the job's outcome without having read it from its
\* watch. With Termination (every agent ends, under fairness), a waiting agent learns the
\* outcome eventually; a re-arm of the wait is a stuttering step, which fairness allows.
WatchDelivers == \A a \in Agents : proc[a] = "exit" /\ rep[a][1] # "SUCCEEDED" => seen[a]

=============================================================================
