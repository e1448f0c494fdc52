"""Acting master in the role state (``broker/role.py``): a slave flips into and out of
acting many times, its acting services start in order and stop in reverse each time (with
the flag up while they run), only a slave acts, a change of role ends acting first, and a
failing acting service is reported without stopping the others."""

from __future__ import annotations

import asyncio

from hamq.broker.role import BrokerRole, RoleService, RoleServices, RoleState

ACTING = ["acting_delay_delivery", "acting_transaction_check", "acting_pop_revive"]
MASTER = ["ha_master", "delay_delivery", "transaction_check", "pop_revive"]
SLAVE = ["ha_client", "slave_sync"]
WAIT_S = 10.0


class Calls:
    """Role services that record (action, name, acting flag seen then)."""

    def __init__(self, role: RoleState) -> None:
        self.role = role
        self.log: list[tuple[str, str, bool]] = []
        self.fail: set[tuple[str, str]] = set()
        role.services = RoleServices(
            master=[self._service(n) for n in MASTER],
            slave=[self._service(n) for n in SLAVE],
            acting=[self._service(n) for n in ACTING],
        )

    def _service(self, name: str) -> RoleService:
        async def act(action: str) -> None:
            await asyncio.sleep(0)  # a real service yields: a concurrent call may run
            self.log.append((action, name, self.role.is_acting_master))
            if (name, action) in self.fail:
                raise RuntimeError(f"{name} cannot {action}")

        return RoleService(name, lambda: act("start"), lambda: act("stop"))

    def take(self) -> list[tuple[str, str, bool]]:
        taken, self.log = self.log, []
        return taken


def run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, WAIT_S))


async def started(role_: BrokerRole = BrokerRole.SLAVE, acting: bool = False):
    """A member started in ``role_`` (acting if asked), its calls so far taken."""
    role = RoleState(role_, 1, "127.0.0.1:1")
    calls = Calls(role)
    await role.start()
    if acting:
        assert await role.set_acting_master(True)
    calls.take()
    return role, calls


START = [("start", n, True) for n in ACTING]
STOP = [("stop", n, True) for n in reversed(ACTING)]  # the flag drops after they stopped


def test_a_slave_flips_into_and_out_of_acting_repeatedly():
    async def scenario() -> None:
        role = RoleState(BrokerRole.SLAVE, 1, "127.0.0.1:1")
        calls = Calls(role)
        await role.start()
        assert calls.take() == [("start", n, False) for n in SLAVE]
        for flip in range(5):
            assert await role.set_acting_master(True)
            assert calls.take() == START and role.is_acting_master
            assert role.running == set(SLAVE) | set(ACTING)
            assert not await role.set_acting_master(True)  # already acting: nothing
            assert calls.take() == []
            assert await role.set_acting_master(False)
            assert calls.take() == STOP and not role.is_acting_master
            assert role.running == set(SLAVE)
            assert not await role.set_acting_master(False)
            assert role.acting_changes == 2 * (flip + 1)
        assert role.role is BrokerRole.SLAVE and role.changes == 0  # never a role change

    run(scenario())


def test_only_a_slave_acts():
    async def scenario() -> None:
        role, calls = await started(BrokerRole.MASTER)
        assert not await role.set_acting_master(True)
        assert calls.take() == [] and not role.is_acting_master

    run(scenario())


def test_a_change_of_role_ends_acting_first():
    async def scenario() -> None:
        role, calls = await started(acting=True)
        assert await role.change(BrokerRole.MASTER, "127.0.0.1:2")
        # acting services stop (reverse), then the slave's, then the master's start: the
        # delay delivery never runs twice at once under its two names
        assert calls.take() == STOP + [("stop", n, False) for n in reversed(SLAVE)] + [
            ("start", n, False) for n in MASTER
        ]
        assert not role.is_acting_master and role.running == set(MASTER)
        assert not await role.set_acting_master(True)  # a master does not act
        assert await role.change(BrokerRole.SLAVE, "127.0.0.1:2")
        assert await role.set_acting_master(True)
        calls.take()
        # even a change to the role it has (a slave told of another master) ends acting:
        # the next member-group decision says whether to act again
        assert not await role.change(BrokerRole.SLAVE, "127.0.0.1:3")
        assert calls.take() == STOP and not role.is_acting_master

    run(scenario())


def test_concurrent_flips_and_changes_are_serialised():
    """Flips and a change asked for at once run one after the other: acting services
    never run beside the master's, and each start is matched by a stop."""

    async def scenario() -> None:
        role, calls = await started()
        await asyncio.gather(
            role.set_acting_master(True),
            role.change(BrokerRole.MASTER, "127.0.0.1:2"),
            role.set_acting_master(True),  # refused: a master by then
            role.set_acting_master(False),
        )
        running: set[str] = set()
        for action, name, _ in calls.take():
            (running.add if action == "start" else running.discard)(name)
            assert not (running & set(ACTING) and running & set(MASTER)), running
        assert running == set(MASTER) == role.running and not role.is_acting_master

    run(scenario())


def test_a_failing_acting_service_is_reported_and_the_others_run():
    async def scenario() -> None:
        role, calls = await started()
        calls.fail.add(("acting_transaction_check", "start"))
        assert await role.set_acting_master(True)
        assert role.running == set(SLAVE) | {"acting_delay_delivery", "acting_pop_revive"}
        assert "start failed" in role.info()["errors"]["acting_transaction_check"]
        calls.fail.clear()
        assert await role.set_acting_master(False)
        assert role.running == set(SLAVE)
        await role.stop()
        assert role.running == set()

    run(scenario())


def test_stop_ends_acting():
    async def scenario() -> None:
        role, calls = await started(acting=True)
        await role.stop()
        assert calls.take() == STOP + [("stop", n, False) for n in reversed(SLAVE)]
        assert not role.is_acting_master and role.running == set()

    run(scenario())


def test_restart_from_restarts_the_tail_of_the_masters_services_only():
    """A master whose lease lapsed runs pre-online again (``restart_from``): the services
    from the named one on stop in reverse and start again in order; those before it keep
    running. A slave, or a name no master service has, changes nothing."""

    async def scenario() -> None:
        role, calls = await started(BrokerRole.MASTER)
        assert await role.restart_from("delay_delivery")
        tail = MASTER[1:]
        assert calls.take() == [("stop", n, False) for n in reversed(tail)] + [
            ("start", n, False) for n in tail
        ]
        assert role.running == set(MASTER)
        assert not await role.restart_from("no_such_service")
        slave, slave_calls = await started()
        assert not await slave.restart_from("delay_delivery")
        assert calls.take() == slave_calls.take() == []

    run(scenario())
