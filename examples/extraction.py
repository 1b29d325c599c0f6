"""Structured extraction: pull typed fields out of free text with a Pydantic model."""

from __future__ import annotations

from pydantic import BaseModel, Field

from chatkit import Conversation, Model

TEXT = ("Hi, this is Maria Gonzalez from Lisbon. I'm 34 and I work as a nurse. "
        "You can reach me at maria.g@example.org.")


class Contact(BaseModel):
    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=130)
    city: str = Field(max_length=30)
    email: str = Field(max_length=60)


def main() -> None:
    conv = Conversation(Model.load(), system="Extract the contact details as JSON.")
    reply = conv.send(TEXT, schema=Contact, max_tokens=96)
    contact: Contact = reply.parsed  # Reply[Contact]: typed, validated twice
    print(contact.model_dump_json())


if __name__ == "__main__":
    main()
