"""skill: Multi-Step Workflows. A retail support desk: find the customer, list their orders, cancel one, redirect another, add a gift note."""

FIRST = ["Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jun"]
LAST = ["Park", "Silva", "Okafor", "Novak", "Haddad", "Lind", "Moreau", "Tanaka"]
STREETS = ["Elm Street", "Harbour Road", "Mill Lane", "Cedar Avenue", "Quarry Way", "Station Road"]
PRODUCTS = ["kettle", "desk lamp", "rain jacket", "chess set", "yoga mat", "headphones", "teapot"]
NOTES = ["Happy birthday!", "Congratulations on the new job", "With love from us", "Enjoy the trip"]


class RetailOrdersEnv(ToolEnv):
    """Hidden state: customers and orders. The target customer has one pending order (to cancel),
    one processing order (to re-address and annotate) and one delivered order (to leave alone)."""

    TOOLS = [
        {"name": "find_customer", "description": "Look up a customer by email address; returns the customer id and name.",
         "parameters": {"type": "object", "properties": {"email": {"type": "string", "description": "The customer's email."}},
                        "required": ["email"]}},
        {"name": "list_orders", "description": "List a customer's orders with their ids, items and statuses.",
         "parameters": {"type": "object", "properties": {"customer_id": {"type": "string", "description": "Customer id, e.g. C104."}},
                        "required": ["customer_id"]}},
        {"name": "cancel_order", "description": "Cancel an order. Only orders with status 'pending' can be cancelled.",
         "parameters": {"type": "object", "properties": {"order_id": {"type": "string", "description": "Order id, e.g. O5512."}},
                        "required": ["order_id"]}},
        {"name": "update_address", "description": "Change the shipping address of an order that has not shipped yet (pending or processing).",
         "parameters": {"type": "object", "properties": {"order_id": {"type": "string"},
                                                         "address": {"type": "string", "description": "Full street address."}},
                        "required": ["order_id", "address"]}},
        {"name": "add_gift_note", "description": "Attach a gift note to an order that has not been delivered or cancelled.",
         "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}, "note": {"type": "string"}},
                        "required": ["order_id", "note"]}},
    ]

    def setup(self, rng):
        customers, orders = {}, {}
        ids = rng.sample(range(100, 200), 5)
        for k, cid in enumerate(ids):
            first, last = rng.choice(FIRST), rng.choice(LAST)
            customers[f"C{cid}"] = {"name": f"{first} {last}", "email": f"{first.lower()}.{last.lower()}{k}@example.com"}
        order_ids = iter(rng.sample(range(5000, 6000), 3 * len(customers)))
        for cid in customers:
            for status in ("pending", "processing", "delivered"):
                oid = f"O{next(order_ids)}"
                orders[oid] = {"customer": cid, "status": status, "item": rng.choice(PRODUCTS),
                               "address": f"{rng.randint(1, 99)} {rng.choice(STREETS)}", "note": ""}
        target = rng.choice(sorted(customers))
        mine = {o["status"]: oid for oid, o in orders.items() if o["customer"] == target}
        new_address = f"{rng.randint(100, 400)} {rng.choice(STREETS)}"
        note = rng.choice(NOTES)
        self.state = {"customers": customers, "orders": orders, "listed": None, "target": target,
                      "pending": mine["pending"], "processing": mine["processing"],
                      "new_address": new_address, "note": note}
        email = customers[target]["email"]
        self.instructions = [
            (f"Hi, this is {customers[target]['name']} ({email}). Can you pull up the list of my orders?",
             lambda s: s["listed"] == s["target"]),
            ("Please cancel the order of mine that has not started processing yet.",
             lambda s: s["orders"][s["pending"]]["status"] == "cancelled"),
            (f"My order that is being processed should go to {new_address} instead.",
             lambda s: s["orders"][s["processing"]]["address"] == s["new_address"]),
            (f"Last thing: add the gift note \"{note}\" to that same order.",
             lambda s: s["orders"][s["processing"]]["note"] == s["note"]),
        ]

    def tool_find_customer(self, email):
        for cid, c in self.state["customers"].items():
            if c["email"].lower() == str(email).strip().lower():
                return f"Customer {cid}: {c['name']} <{c['email']}>"
        return f"Error: no customer with email '{email}'."

    def tool_list_orders(self, customer_id):
        cid = str(customer_id).strip()
        if cid not in self.state["customers"]:
            return f"Error: unknown customer id '{cid}'."
        self.state["listed"] = cid
        rows = [f"{oid}: {o['item']}, status {o['status']}, ship to {o['address']}"
                for oid, o in sorted(self.state["orders"].items()) if o["customer"] == cid]
        return "\n".join(rows)

    def _order(self, order_id):
        return self.state["orders"].get(str(order_id).strip())

    def tool_cancel_order(self, order_id):
        order = self._order(order_id)
        if order is None:
            return f"Error: unknown order '{order_id}'."
        if order["status"] != "pending":
            return f"Error: order {order_id} is {order['status']} and cannot be cancelled."
        order["status"] = "cancelled"
        return f"Order {order_id} cancelled."

    def tool_update_address(self, order_id, address):
        order = self._order(order_id)
        if order is None:
            return f"Error: unknown order '{order_id}'."
        if order["status"] not in ("pending", "processing"):
            return f"Error: order {order_id} is {order['status']}; its address can no longer change."
        order["address"] = str(address).strip()
        return f"Order {order_id} will ship to {order['address']}."

    def tool_add_gift_note(self, order_id, note):
        order = self._order(order_id)
        if order is None:
            return f"Error: unknown order '{order_id}'."
        if order["status"] in ("delivered", "cancelled"):
            return f"Error: order {order_id} is {order['status']}; no note can be added."
        order["note"] = str(note)
        return f"Gift note added to order {order_id}."

    def solution(self):
        s = self.state
        email = s["customers"][s["target"]]["email"]
        return [
            {"name": "find_customer", "arguments": {"email": email}},
            {"name": "list_orders", "arguments": {"customer_id": s["target"]}},
            {"name": "cancel_order", "arguments": {"order_id": s["pending"]}},
            {"name": "update_address", "arguments": {"order_id": s["processing"], "address": s["new_address"]}},
            {"name": "add_gift_note", "arguments": {"order_id": s["processing"], "note": s["note"]}},
        ]
