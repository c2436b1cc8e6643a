"""skill: Error Recovery. A smart-home hub whose devices fail in recoverable ways: an offline thermostat, range limits, a PIN-protected lock."""

ROOMS = ["living room", "bedroom", "kitchen", "study", "hallway"]


class SmartHomeEnv(ToolEnv):
    """Hidden state: devices by id. The target thermostat starts offline (needs a reboot), the
    thermostat rejects values outside 16-28 C, and the front door lock needs the security PIN."""

    TOOLS = [
        {"name": "list_devices", "description": "List devices with id, type, room and status. Optionally filter by room.",
         "parameters": {"type": "object", "properties": {"room": {"type": "string", "description": "Room name (optional)."}},
                        "required": []}},
        {"name": "reboot_device", "description": "Power-cycle a device so that it comes back online.",
         "parameters": {"type": "object", "properties": {"device_id": {"type": "string"}}, "required": ["device_id"]}},
        {"name": "set_thermostat", "description": "Set a thermostat's target temperature in degrees Celsius (16-28).",
         "parameters": {"type": "object", "properties": {"device_id": {"type": "string"}, "celsius": {"type": "number"}},
                        "required": ["device_id", "celsius"]}},
        {"name": "set_light", "description": "Switch a light on or off.",
         "parameters": {"type": "object", "properties": {"device_id": {"type": "string"}, "on": {"type": "boolean"}},
                        "required": ["device_id", "on"]}},
        {"name": "get_security_pin", "description": "Return the household security PIN needed by locks.",
         "parameters": {"type": "object", "properties": {}, "required": []}},
        {"name": "lock_door", "description": "Lock a door lock; requires the security PIN.",
         "parameters": {"type": "object", "properties": {"device_id": {"type": "string"}, "pin": {"type": "string"}},
                        "required": ["device_id", "pin"]}},
    ]

    def setup(self, rng):
        rooms = rng.sample(ROOMS, 3)
        numbers = iter(rng.sample(range(10, 99), 12))
        devices = {}

        def add(kind, room, **extra):
            did = f"{kind[:2]}-{next(numbers)}"
            devices[did] = {"type": kind, "room": room, "online": True, **extra}
            return did

        thermo = add("thermostat", rooms[0], target=20)
        devices[thermo]["online"] = False
        add("thermostat", rooms[1], target=19)
        dark_room = rooms[2]
        lights = [add("light", dark_room, on=True) for _ in range(2)]
        add("light", rooms[0], on=True)
        add("light", rooms[1], on=False)
        door = add("lock", "front door", locked=False)
        target = rng.choice([v for v in range(17, 27) if v != 20])
        self.state = {"devices": devices, "pin": f"{rng.randint(0, 9999):04d}", "thermo": thermo,
                      "target": target, "lights": lights, "door": door}
        self.instructions = [
            (f"Set the {rooms[0]} thermostat to {target} degrees Celsius.",
             lambda s: s["devices"][s["thermo"]]["target"] == s["target"]),
            (f"Turn off every light in the {dark_room}.",
             lambda s: all(not s["devices"][d]["on"] for d in s["lights"])),
            ("Lock the front door.", lambda s: s["devices"][s["door"]]["locked"]),
        ]

    def _device(self, device_id, kind):
        dev = self.state["devices"].get(str(device_id).strip())
        if dev is None:
            return None, f"Error: no device '{device_id}'."
        if dev["type"] != kind:
            return None, f"Error: device {device_id} is a {dev['type']}, not a {kind}."
        if not dev["online"]:
            return None, f"Error: device {device_id} is offline. Reboot it first."
        return dev, ""

    def tool_list_devices(self, room=None):
        rows = []
        for did, d in sorted(self.state["devices"].items()):
            if room and str(room).strip().lower() != d["room"]:
                continue
            status = "offline" if not d["online"] else ", ".join(
                f"{k}={v}" for k, v in d.items() if k not in ("type", "room", "online"))
            rows.append(f"{did}: {d['type']} in {d['room']} ({status})")
        return "\n".join(rows) or f"No devices in '{room}'."

    def tool_reboot_device(self, device_id):
        dev = self.state["devices"].get(str(device_id).strip())
        if dev is None:
            return f"Error: no device '{device_id}'."
        dev["online"] = True
        return f"Device {device_id} rebooted and online."

    def tool_set_thermostat(self, device_id, celsius):
        dev, err = self._device(device_id, "thermostat")
        if dev is None:
            return err
        try:
            value = float(celsius)
        except (TypeError, ValueError):
            return "Error: celsius must be a number."
        if not 16 <= value <= 28:
            return "Error: target must be between 16 and 28 degrees Celsius."
        dev["target"] = int(value) if value == int(value) else value
        return f"Thermostat {device_id} set to {dev['target']} C."

    def tool_set_light(self, device_id, on):
        dev, err = self._device(device_id, "light")
        if dev is None:
            return err
        if not isinstance(on, bool):
            return "Error: 'on' must be true or false."
        dev["on"] = on
        return f"Light {device_id} turned {'on' if on else 'off'}."

    def tool_get_security_pin(self):
        return f"Security PIN: {self.state['pin']}"

    def tool_lock_door(self, device_id, pin):
        dev, err = self._device(device_id, "lock")
        if dev is None:
            return err
        if str(pin).strip() != self.state["pin"]:
            return "Error: wrong PIN. The lock stays open."
        dev["locked"] = True
        return f"Lock {device_id} is locked."

    def solution(self):
        s = self.state
        return [
            {"name": "list_devices", "arguments": {}},
            {"name": "set_thermostat", "arguments": {"device_id": s["thermo"], "celsius": s["target"]}},
            {"name": "reboot_device", "arguments": {"device_id": s["thermo"]}},
            {"name": "set_thermostat", "arguments": {"device_id": s["thermo"], "celsius": s["target"]}},
            *[{"name": "set_light", "arguments": {"device_id": d, "on": False}} for d in s["lights"]],
            {"name": "get_security_pin", "arguments": {}},
            {"name": "lock_door", "arguments": {"device_id": s["door"], "pin": s["pin"]}},
        ]
