"""Attribute keys inferred from memory text, and the sibling check that guards replacement.

A memory is about a *subject* (Maya, the customer's manager, the staging database) and one of its
*attributes* (home city, plan, phone), sometimes narrowed by a *qualifier* (billing vs shipping
address, return vs outbound flight). Two texts about look-alike siblings share most of their words,
so neither the embedder nor the NLI model can be trusted to keep them apart; :func:`relate` does it
with plain text analysis:

* ``key_conflict``: the texts are about different subjects (two named people, the customer vs the
  customer's manager, one child vs another) or carry contrasting qualifiers from one family
  (:data:`FAMILIES`), or the new text announces another instance ("a second office"). A conflict
  forbids replacing the old memory with the new one, so every cue here is chosen to be precise.
* ``key_match``: same subject (as far as the text tells) and same canonical attribute, no conflict:
  an update of that attribute is plausible.
* neither, when the text does not tell.

Explicit keys given by API clients always win: equal keys match, different keys conflict.

Pure: ``re`` and tables, no I/O. Analyses are memoised because stored memories are compared again
and again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["FAMILIES", "AttributeKey", "Family", "Relation", "infer_key", "relate"]


@dataclass(frozen=True, slots=True)
class AttributeKey:
    """What a memory is about: ``str(key)`` is ``subject/attribute[qualifiers]``.

    ``subject`` is a slug ("maya", "customer.manager", "staging_database"), or None when the text
    does not name one; ``qualifiers`` are ``family:value`` tags ("direction:return").
    """

    subject: str | None
    attribute: str
    qualifiers: frozenset[str] = frozenset()

    def __str__(self) -> str:
        text = f"{self.subject or '*'}/{self.attribute}"
        if self.qualifiers:
            text += "[" + ",".join(sorted(self.qualifiers)) + "]"
        return text


@dataclass(frozen=True, slots=True)
class Relation:
    """How a new fact relates to a stored memory, judged from their text (or explicit keys)."""

    key_match: bool
    """Same subject and attribute: an update of the old memory by the new fact is plausible."""
    key_conflict: bool
    """Siblings (different subject, contrasting qualifier, another instance): never replace."""
    reason: str
    """Short machine-readable reason: ``qualifier:return!=outbound``, ``subject:leo!=clara``..."""


@dataclass(frozen=True, slots=True)
class Family:
    """Mutually exclusive qualifiers: two texts with disjoint values of one family are siblings.

    A trigger word counts when it modifies one of ``heads`` (up to three words before the head, or
    "head for/on the trigger" after it), or, where ``heads`` is None, when it stands in the subject
    of the sentence or right after a determiner ("the staging database"). ``loose`` triggers are
    unambiguous enough to count anywhere.
    """

    name: str
    values: dict[str, tuple[str, ...]]
    heads: frozenset[str] | None = None
    loose: frozenset[str] = frozenset()


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# --- the tables ----------------------------------------------------------------------------------

_BODY_PARTS = _words(
    "knee knees hip hips ear ears eye eyes hand hands arm arms leg legs foot feet shoulder"
    " shoulders wrist wrists ankle ankles elbow elbows lung kidney breast side molar tooth teeth"
    " lobe heel thumb finger toe cheek temple calf thigh hamstring achilles ventricle atrium"
)
_RELATION_NOUNS = _words(
    "mother mum mom mommy mama father dad daddy papa parent parents wife husband spouse partner"
    " fiance fiancee fiancé fiancée boyfriend girlfriend son sons daughter daughters child children"
    " kid kids baby brother brothers sister sisters sibling siblings twin grandmother grandma gran"
    " granny nan nana grandfather grandpa grandad granddad grandparent grandparents grandson"
    " granddaughter grandchild aunt uncle cousin niece nephew stepson stepdaughter stepmother"
    " stepfather mother-in-law father-in-law sister-in-law brother-in-law son-in-law"
    " daughter-in-law boss manager supervisor assistant colleague coworker co-worker teammate"
    " friend roommate flatmate housemate neighbour neighbor landlord landlady tenant nanny"
    " caregiver carer ceo cfo cto coo cio ciso founder co-founder cofounder secretary pa deputy"
    " dog dogs cat cats puppy kitten horse pony rabbit parrot hamster"
)
_CHILD_NOUNS = _words("son daughter child kid baby brother sister sibling twin boy girl one")

FAMILIES: tuple[Family, ...] = (
    Family(
        "direction",
        {
            "outbound": ("outbound", "outward", "departing", "onward", "out"),
            "return": ("return", "inbound", "homebound", "homeward", "returning", "back"),
        },
        _words(
            "flight flights leg legs ticket tickets trip journey train ferry bus coach sailing"
            " booking seat seats baggage bag bags allowance transfer date segment crossing pickup"
            " drive fare connection departure flies fly flying flew"
        ),
        frozenset({"outbound", "outward", "inbound", "homebound", "homeward"}),
    ),
    Family(
        "address",
        {
            "billing": ("billing", "invoice", "invoicing"),
            "shipping": ("shipping", "delivery", "ship-to", "dispatch"),
            "home": ("home", "residential", "personal", "private"),
            "work": ("work", "office", "business", "company", "corporate"),
            "mailing": ("mailing", "postal", "correspondence"),
            "registered": ("registered",),
        },
        _words("address addresses postcode zip"),
    ),
    Family(
        "usage",
        {
            "personal": ("personal", "private", "home", "own"),
            "work": ("work", "office", "business", "company", "corporate", "professional"),
        },
        _words(
            "phone phones number numbers mobile cell cellphone landline line email e-mail inbox"
            " laptop computer pc desktop machine device calendar account car vehicle card server"
            " extension handset tablet ipad iphone"
        ),
    ),
    Family(
        "phone_type",
        {
            "mobile": ("mobile", "cell", "cellphone", "cellular"),
            "landline": ("landline", "desk", "fixed-line"),
        },
        _words("phone phones number numbers line landline mobile cell cellphone"),
    ),
    Family(
        "environment",
        {
            "staging": ("staging", "stage", "stg", "pre-prod", "preprod", "pre-production"),
            "production": ("production", "prod", "live"),
            "development": ("development", "dev"),
            "test": ("test", "testing", "qa", "uat"),
            "sandbox": ("sandbox",),
            "preview": ("preview",),
        },
        None,
        frozenset({"staging", "pre-prod", "preprod", "pre-production", "production", "prod"}),
    ),
    Family(
        "platform",
        {
            "ios": ("ios", "iphone", "ipad"),
            "android": ("android",),
            "web": ("web", "browser"),
            "desktop": ("desktop", "windows", "macos", "mac"),
        },
        _words(
            "app apps application client build builds release releases sdk store listing widget"
        ),
    ),
    Family(
        "tier",
        {
            "frontend": ("frontend", "front-end", "client-side"),
            "backend": ("backend", "back-end", "server-side"),
        },
        None,
        frozenset({"frontend", "front-end", "backend", "back-end"}),
    ),
    Family(
        "rank",
        {
            "primary": ("primary", "main", "first"),
            "secondary": ("secondary", "second", "backup", "alternate", "alternative"),
            "tertiary": ("tertiary", "third"),
        },
    ),
    Family(
        "side",
        {"left": ("left",), "right": ("right",)},
        _BODY_PARTS | _words("wing lane hand-side"),
    ),
    Family(
        "compass",
        {
            "north": ("north", "northern"),
            "south": ("south", "southern"),
            "east": ("east", "eastern"),
            "west": ("west", "western"),
        },
        _words(
            "wing side entrance gate office building campus branch tower block car-park lot stand"
            " exit door site depot warehouse yard"
        ),
    ),
    Family(
        "floor",
        {
            "upstairs": ("upstairs", "top-floor", "upper-floor"),
            "downstairs": ("downstairs", "ground-floor", "basement", "lower-floor"),
        },
        None,
        frozenset({"upstairs", "downstairs", "top-floor", "upper-floor", "ground-floor"}),
    ),
    Family(
        "meal",
        {
            "breakfast": ("breakfast",),
            "lunch": ("lunch", "lunchtime"),
            "dinner": ("dinner", "supper"),
        },
        None,
        frozenset({"breakfast", "lunch", "lunchtime", "dinner", "supper"}),
    ),
    Family(
        "department",
        {
            "sales": ("sales",),
            "support": ("support", "helpdesk", "help-desk", "service-desk"),
            "billing": ("billing", "accounts", "finance", "ap", "invoicing"),
            "technical": ("technical", "tech", "it", "engineering"),
            "legal": ("legal",),
            "hr": ("hr", "people"),
            "marketing": ("marketing",),
            "security": ("security",),
            "procurement": ("procurement", "purchasing"),
            "compliance": ("compliance",),
            "operations": ("operations", "ops"),
        },
        _words(
            "contact contacts lead team rep representative manager email inbox queue line channel"
            " owner person poc department dept officer director head liaison"
        ),
    ),
    Family(
        "account",
        {
            "checking": ("checking", "current", "chequing"),
            "savings": ("savings", "saving", "deposit"),
            "credit": ("credit",),
            "brokerage": ("brokerage", "investment", "trading"),
            "retirement": ("retirement", "pension", "401k", "ira", "isa"),
        },
        _words("account accounts acct"),
    ),
    Family(
        "age",
        {
            "elder": ("older", "oldest", "elder", "eldest", "big"),
            "younger": ("younger", "youngest", "little", "baby"),
            "middle": ("middle",),
        },
        _CHILD_NOUNS | _words("sons daughters children kids brothers sisters"),
    ),
    Family(
        "garment",
        {
            "shoe": ("shoe", "shoes", "footwear", "boots", "trainers", "sneakers"),
            "top": ("top", "tops", "shirt", "shirts", "t-shirt", "t-shirts", "blouse", "blouses"),
            "bottom": ("trousers", "pants", "jeans", "skirt", "skirts", "shorts", "waist"),
            "dress": ("dress", "dresses"),
            "ring": ("ring",),
            "jacket": ("jacket", "jackets", "coat", "coats"),
        },
        _words("size sizes fit"),
    ),
    Family(
        "scope",
        {
            "group": ("group", "global", "parent", "holding", "worldwide"),
            "local": ("subsidiary", "branch", "arm", "division", "regional", "local"),
        },
    ),
    Family(
        "log",
        {
            "application": ("app", "application", "applications"),
            "audit": ("audit",),
            "access": ("access",),
            "error": ("error",),
            "system": ("system",),
        },
        _words("log logs logging"),
    ),
    Family(
        "telemetry",
        {
            "logs": ("logs", "log", "logging"),
            "metrics": ("metrics", "metric"),
            "traces": ("traces", "trace", "tracing", "spans"),
            "backups": ("backup", "backups", "snapshot", "snapshots"),
        },
        _words("retention retained kept stored storage"),
    ),
    Family(
        "loyalty",
        {
            "airline": ("airline", "frequent-flyer", "flyer", "flying"),
            "hotel": ("hotel",),
            "rail": ("rail",),
            "car_rental": ("car-rental", "rental"),
        },
        _words("status loyalty membership points program programme tier card elite miles number"),
    ),
    Family(
        "course",
        {
            word: (word,)
            for word in (
                "english spanish french german italian portuguese mandarin chinese cantonese"
                " japanese korean arabic russian dutch swedish norwegian danish finnish polish"
                " hindi urdu turkish greek latin hebrew welsh irish piano violin viola cello guitar"
                " bass drums flute clarinet trumpet trombone saxophone harp ukulele singing voice"
                " swimming football soccer tennis ballet dance karate judo taekwondo gymnastics"
                " chess art drama coding maths math physics chemistry biology history yoga pilates"
                " spin climbing riding rugby cricket hockey netball basketball baseball athletics"
                " running cycling rowing fencing boxing"
            ).split()
        },
        _words(
            "class classes lesson lessons course courses teacher tutor exam exams practice practise"
            " club coach training session sessions camp recital tuition homework grade"
        ),
    ),
)

# Region codes mark a regional arm of a company ("Baymark Cargo UK"); matched case-sensitively.
_REGION_CODES = frozenset(
    "UK US USA EU EMEA APAC LATAM ANZ DACH UAE AMER NZ AU DE FR NL JP SG".split()
)
_INSTANCE_MARKERS = {
    "second": "second",
    "another": "another",
    "additional": "additional",
    "third": "third",
    "fourth": "fourth",
    "extra": "extra",
    "separate": "separate",
}
_INSTANCE_BLOCKERS = _words("to into for with from than of by via instead")

_DETERMINERS = _words("the a an our my your his her their its this that these those both each")
_POSSESSIVE_PRONOUNS = _words("my our your his her their its")
_SUBJECT_PRONOUNS = {"i": "self", "we": "self", "he": "pron", "she": "pron", "they": "pron"}
_PREPOSITIONS = _words(
    "on for at in of with from to during via under over by about near into onto per as after"
    " before since until than between within without across"
)
_TITLES = _words("dr mr mrs ms miss mx prof sir dame")
_ROLE_NOUNS = _words(
    "customer customers client clients patient patients user users tenant tenants member members"
    " student students guest guests caller buyer buyers account family household company team"
    " employee employees candidate applicant subscriber resident owner"
)
_AUX = _words(
    "is are was were be been being am has have had will would can could should must might does do"
    " did got gets isn't aren't wasn't weren't doesn't don't didn't hasn't haven't won't can't"
    " it's he's she's they're we're i'm i've we've they've"
)
_PRE_VERB = _words(
    "no not never now just recently also still usually always currently finally already often"
    " sometimes typically normally only used"
)
_VERBS = _words(
    "lives live works runs uses takes plays prefers wants needs goes drives owns pays costs"
    " requires supports manages sees sends receives opens closes flies leaves arrives starts ends"
    " expires renews teaches studies speaks wears likes loves hates enjoys says keeps sits stays"
    " shops subscribes syncs ships grows sells handles employs leases rents visits attends trains"
    " swims practises practices travels commutes cycles walks reads writes hosts serves covers"
    " includes allows signs approves reports belongs holds joins quit quits left became becomes"
    " moves switches upgrades downgrades migrates changes reschedules cancels books orders buys"
    " bought sold sent made took gave went came began begun ran wrote drove flew grew kept told"
    " lets let goes sleeps eats drinks smokes suffers deploys deploy builds built hit rose fell"
    " cut put set reaches earns lasts go live pay prefer want get arrive leave receive require"
    " see send take run use departs lands boards returns"
)
_NOT_VERB_ED = _words(
    "need bed red seed speed feed shed breed hundred sacred naked wicked bred reed weed deed steed"
    " greed tweed embed"
)
_NUMBER_WORDS = _words(
    "one two three four five six seven eight nine ten eleven twelve twenty thirty forty fifty"
    " hundred thousand first second third half both all each every several some many few no none"
)
_CALENDAR = _words(
    "january february march april may june july august september october november december jan feb"
    " mar apr jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday saturday"
    " sunday mondays tuesdays wednesdays thursdays fridays saturdays sundays today tomorrow"
    " yesterday tonight weekday weekdays weekend weekends morning evening night spring summer"
    " autumn fall winter christmas easter"
)
_STARTERS = _words(
    "please keep use write explain start skip prefer show respond sign avoid always never don't"
    " do note update fyi btw also so then when if while because since after before both each"
    " every all any some no yes here there this that these those it its what which who whose"
    " where how why new old current previous next last latest rent mortgage search design"
    " dashboards dashboard metrics ingestion alerts uptime error errors application applications"
    " audit trace traces logs log snapshots backups backup workers worker room hotel order orders"
    " flight flights train trains checkout delivery payment payments invoices invoice direct crash"
    " two-factor staff office meeting standup budget revenue price project release version sprint"
    " home work data cost costs total annual monthly weekly daily yearly average minimum maximum"
    " max min default standard premium basic free pro enterprise plan plans tier insurance policy"
    " contract renewal subscription seats seat licence license storage quota retention region"
    " cluster server servers database databases frontend backend api app apps service services"
    " team teams support sales billing shipping security compliance legal marketing finance"
    " engineering product products customer client patient user users tenant member guest"
    " parent-teacher e2e ci cd sso mfa 2fa vpn email emails phone phones mobile landline address"
    " birthday appointment appointments school class classes lesson lessons car bike bus doctor"
    " dentist gp nurse physio therapist vet gym membership diet allergy allergies medication"
    " dose breakfast lunch dinner return outbound personal private primary secondary main"
    " upstairs downstairs left right first second third another other"
)

# Canonical attributes: head nouns (and a few verbs) that name the same attribute.
_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "home_city": (
        "city",
        "town",
        "hometown",
        "residence",
        "lives",
        "living",
        "resides",
        "relocated",
        "moved",
        "headquarters",
        "hq",
        "head-office",
        "based",
        "location",
    ),
    "address": ("address", "addresses", "addr", "postcode", "zip"),
    "phone": ("phone", "telephone", "tel", "mobile", "cell", "cellphone", "landline", "extension"),
    "email": ("email", "e-mail", "inbox", "mail"),
    "job": (
        "job",
        "role",
        "position",
        "title",
        "occupation",
        "employer",
        "profession",
        "career",
        "works",
        "employed",
    ),
    "plan": ("plan", "tier", "subscription", "package", "edition"),
    "seats": ("seats", "seat", "licences", "licenses"),
    "price": ("price", "cost", "costs", "fee", "fees", "rate", "premium", "charge"),
    "medication": ("dose", "dosage", "medication", "meds", "medicine", "prescription"),
    "allergy": ("allergy", "allergies", "allergic"),
    "appointment": ("appointment", "appt", "consultation", "check-up", "checkup"),
    "opening_hours": ("opens", "opening", "hours", "closes", "closing"),
    "birthday": ("birthday", "dob", "born"),
    "timezone": ("timezone", "time-zone"),
    "language": ("language", "languages"),
    "retention": ("retention", "retained", "kept"),
    "payment_method": ("payment", "paid", "pays"),
    "contact": ("contact", "poc", "liaison"),
}
_ATTRIBUTE_OF = {word: attr for attr, words in _ATTRIBUTES.items() for word in words}
_GENERIC_HEADS = _words(
    "number date time day name size setting settings value level details info id code status"
    " type window schedule"
)
_TIME_WORDS = _CALENDAR | _words(
    "week weeks month months year years quarter day days this next last today tonight currently"
)
_ADJECTIVES = _words("preferred current new old usual regular main default latest previous own")

# --- tokens and syntax cues ----------------------------------------------------------------------

_TOKEN = re.compile(
    r"(?P<word>[^\W_](?:[\w.:/+&@#%-]*[\w%])?(?:['’](?:t|re|ve|ll|d|m)\b)?|[#£$€+][\w.,/+-]*\w)"
    r"(?P<poss>['’]s\b|(?<=s)['’](?![\w]))?"
    r"|(?P<punct>[:;,()—–]|\.(?=\s|$))"
)
_IDENT = re.compile(r"^#[\w-]*\d[\w-]*$|^[A-Z]{1,4}-?\d{3,}$")
_NAME_MORPHOLOGY = re.compile(r"(?:ed|ly|tion|sion|ment|ness|ity|ship|ance|ence|ism|ings?)$")
_UNIT_AFTER = _words(
    "mg mcg g kg ml l km mi miles m cm mm gb tb mb kb % percent seats users days weeks months"
    " years hours minutes mins h pm am nodes units staff people passengers kids children times"
    " puffs tablets pills"
)
_LABEL_LIMIT = 12
_COPULAS = _words("is are was were be been joined became becomes 's")
_VALUE_PREPOSITIONS = _words("on in into onto as to from at")
_CHANGE_VERBS = _words(
    "moved switched changed transferred went promoted reassigned upgraded downgraded migrated"
    " rotated rebooked rescheduled"
)
_INTRODUCERS = _words("a an another two three four new second")
_DIRECTION_AFTER = {"back": "return", "home": "return", "out": "outbound", "there": "outbound"}
_UNIT_NOUNS = _words(
    "flat apt apartment unit room suite house plot lot bay gate platform site store branch building"
    " block floor table desk locker court pitch stand ward bed cabin"
)
_UNIT_NUMBER = re.compile(r"^(?:\d+[A-Za-z]?|[A-Z])$")
_CHANGE_CUE = re.compile(
    r"\b(?:new|now|changed|switched|hired|replaced|sold|appointed|took over|no longer)\b",
    re.IGNORECASE,
)
_IMPERATIVES = _words(
    "keep respond reply answer write use avoid show explain include add skip start stop switch"
    " format always never please don't do make give list put cite mention call translate convert"
    " round remember note send text email be try"
)
_NEVER_NAMES = (
    _CALENDAR
    | _DETERMINERS
    | _PREPOSITIONS
    | _AUX
    | _TITLES
    | frozenset(_SUBJECT_PRONOUNS)
    | _words("it you me us them him and or but the")
)
_POST_LINKS = _words("for on in of at the a an my our his her their its (")


# --- typo tolerance: a transposed qualifier ("Andriod") still counts -----------------------------


def _transpositions(word: str) -> set[str]:
    return {word[:i] + word[i + 1] + word[i] + word[i + 2 :] for i in range(len(word) - 1)}


def _trigger_index() -> dict[str, tuple[tuple[str, str], ...]]:
    index: dict[str, list[tuple[str, str]]] = {}
    for family in FAMILIES:
        for value, triggers in family.values.items():
            for trigger in triggers:
                index.setdefault(trigger, []).append((family.name, value))
    exact = set(index)
    for trigger in list(exact):
        if len(trigger) >= 6:
            for variant in _transpositions(trigger) - exact:
                index.setdefault(variant, []).extend(index[trigger])
    return {word: tuple(pairs) for word, pairs in index.items()}


_TRIGGERS = _trigger_index()
_FAMILY = {family.name: family for family in FAMILIES}
_FAMILY_ORDER = (*_FAMILY, "id")
_CANONICAL_TRIGGER = {
    variant: trigger
    for family in FAMILIES
    for triggers in family.values.values()
    for trigger in triggers
    if len(trigger) >= 6
    for variant in _transpositions(trigger)
} | {trigger: trigger for family in FAMILIES for ts in family.values.values() for trigger in ts}
_VOCABULARY = (
    frozenset(_TRIGGERS)
    | _RELATION_NOUNS
    | _ROLE_NOUNS
    | _DETERMINERS
    | _PREPOSITIONS
    | _AUX
    | _PRE_VERB
    | _VERBS
    | _NUMBER_WORDS
    | _CALENDAR
    | _STARTERS
    | _TITLES
    | frozenset(_ATTRIBUTE_OF)
    | frozenset(_SUBJECT_PRONOUNS)
    | frozenset({"it", "you", "me", "us", "them", "him"})
)


# --- analysis ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Token:
    text: str
    low: str
    poss: bool
    punct: bool


@dataclass(frozen=True, slots=True)
class _Subject:
    kind: str
    """name, role, self, pron (he/she/they: any person) or thing."""
    root: tuple[str, ...]
    path: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()
    proper: frozenset[str] = frozenset()
    """Capitalised modifiers of a thing ("leeds" in "the Leeds office")."""
    head: str = ""
    """Head noun of a thing ("office")."""

    def slug(self) -> str:
        root = "_".join(self.root) if self.root else self.kind
        return ".".join((root, *self.path))


@dataclass(frozen=True, slots=True)
class _Features:
    subject: _Subject | None
    attribute: str | None
    qualifiers: dict[str, frozenset[str]]
    instance: str | None
    ordinals: frozenset[str]
    lowercase_words: frozenset[str]
    words: frozenset[str]
    copula_value: str | None
    """First word of the value in "X is <value>" / "X: <value>" (lower-cased), if any."""
    change_cue: bool
    introduced: frozenset[str]
    """Nouns introduced with an indefinite or a count ("has a dog", "two sons")."""


def _tokenize(text: str) -> list[_Token]:
    tokens = []
    for match in _TOKEN.finditer(text):
        word = match["word"]
        if word is None:
            tokens.append(_Token(match["punct"], match["punct"], False, True))
        else:
            low = word.lower().replace("’", "'")
            tokens.append(_Token(word, low, match["poss"] is not None, False))
    return tokens


def _is_verb(tokens: list[_Token], i: int) -> bool:
    token = tokens[i]
    low = token.low
    if token.punct:
        return False
    if i and (tokens[i - 1].poss or tokens[i - 1].low in _DETERMINERS) and low not in _AUX:
        return False  # "Silverpine's invoices", "the trains": a noun after a determiner
    if low in _AUX or low in _PRE_VERB or low in _VERBS:
        return not (low in {"used"} and i + 1 < len(tokens) and tokens[i + 1].low != "to")
    if low.endswith("ed") and len(low) >= 5 and low not in _NOT_VERB_ED and "-" not in low:
        # "Checked bag", "Ruth's preferred window": a participle before a noun is an adjective.
        before = tokens[i - 1] if i else None
        after = tokens[i + 1] if i + 1 < len(tokens) else None
        attributive = (before is None or before.poss or before.low in _DETERMINERS) and (
            after is not None
            and not after.punct
            and after.text[:1].islower()
            and after.low not in _DETERMINERS | _PREPOSITIONS | _AUX
        )
        return not attributive
    return False


def _looks_like_verb(low: str) -> bool:
    """A third-person verb after a name ("Dalia checks"), as opposed to a noun ("Best time")."""
    return low.endswith("s") and not low.endswith(("ss", "us", "is")) or low.endswith("ed")


def _is_name(tokens: list[_Token], i: int, all_lower: bool) -> bool:
    token = tokens[i]
    text, low = token.text, token.low
    if token.punct or any(ch.isdigit() for ch in text):
        return False
    # Mid-sentence a capital letter is a strong cue ("Grace's son Max"); at the start it is not.
    stoplist = _VOCABULARY if i == 0 else _NEVER_NAMES
    if low in stoplist:
        return False
    if text[:1].isupper():
        if text.isupper() and len(text) <= 4 and not token.poss:
            return False  # an acronym (IT, AP, HR), not a person or company
        if i == 0 and not token.poss and _NAME_MORPHOLOGY.search(low) and len(low) >= 6:
            return False
        return True
    # Chat-style lower-case text: "otto upgraded..." / "colette's shop".
    return (all_lower or token.poss) and i == 0 and not _NAME_MORPHOLOGY.search(low)


def _subject_region(tokens: list[_Token]) -> tuple[int, bool]:
    """Index where the subject noun phrase ends, and whether the text is a ``label: value``."""
    limit = min(len(tokens), _LABEL_LIMIT)
    for i in range(limit):
        if tokens[i].low in _AUX or tokens[i].low in {";"}:
            break
        if tokens[i].low == ":":
            return i, True
    if tokens and tokens[0].low in _IMPERATIVES:
        return 0, False  # an instruction ("Respond in French") has no subject
    for i in range(len(tokens)):
        if tokens[i].punct and tokens[i].low in {":", ";", "—", "–", "("}:
            return i, False
        if _is_verb(tokens, i):
            return i, False
    return len(tokens), False


def _skip_titles(tokens: list[_Token], i: int) -> int:
    while i < len(tokens) and (tokens[i].low in _TITLES or tokens[i].low == "."):
        i += 1
    return i


def _name_run(tokens: list[_Token], i: int, end: int, all_lower: bool) -> int:
    """End of a run of name tokens starting at ``i`` ("Sunita Joshi", "Baymark Cargo UK")."""
    j = _skip_titles(tokens, i)
    if j >= end or not _is_name(tokens, j, all_lower):
        return i
    j += 1
    while (
        j < end
        and not tokens[j - 1].poss
        and (_is_name(tokens, j, False) or tokens[j].text in _REGION_CODES)
    ):
        j += 1
    return j


def _parse_subject(tokens: list[_Token], end: int, all_lower: bool) -> tuple[_Subject | None, int]:
    """The subject at the start of the text and the index of the first token after it."""
    if not tokens:
        return None, 0
    i = 0
    first = tokens[0]
    if first.low in _SUBJECT_PRONOUNS and not first.poss:
        return _Subject(_SUBJECT_PRONOUNS[first.low], ()), 1
    kind = ""
    root: tuple[str, ...] = ()
    if first.low in _POSSESSIVE_PRONOUNS:
        kind = "self" if first.low in {"my", "our"} else "pron"
        i = 1
        # "Our support contact": the possessive pronoun owns what follows; nothing more to read.
        if i < end and tokens[i].low not in _RELATION_NOUNS:
            return None, i
    elif first.low in _DETERMINERS:
        i = 1
    if not kind:
        run = _name_run(tokens, i, end, all_lower)
        if (
            run > i
            and not tokens[run - 1].poss
            and run < end
            and tokens[run].text[:1].islower()
            and not _looks_like_verb(tokens[run].low)
        ):
            run = i  # "Best time to call Tobias", "Crash-free rate": a modifier, not a name
        if run > i:
            kind = "name"
            root = tuple(t.low for t in tokens[i:run] if t.low not in _TITLES and t.low != ".")
            i = run
        elif i < end and tokens[i].low in _ROLE_NOUNS:
            kind, root = "role", (tokens[i].low.rstrip("s"),)
            i += 1
        else:
            # A thing ("the search cluster", "staging"): the noun phrase up to its possessive.
            j = i
            while j < end and not tokens[j].poss and not tokens[j].punct:
                if tokens[j].low in _PREPOSITIONS:
                    break
                j += 1
            stop = j + 1 if j < end and tokens[j].poss else j
            phrase = [t for t in tokens[i:stop] if not _is_id(t)]
            words = tuple(t.low for t in phrase if t.low not in _TRIGGERS) or tuple(
                t.low for t in phrase
            )
            # "The Leeds office" vs "The York office": proper-noun modifiers of one head noun.
            proper = frozenset(
                t.low for t in phrase[:-1] if t.text[:1].isupper() and t is not tokens[0]
            )
            head = phrase[-1].low if phrase else ""
            thing = _Subject("thing", words, proper=proper, head=head) if words else None
            return thing, (stop if stop > j else i)
        if not tokens[i - 1].poss:
            return _Subject(
                kind, root, names=frozenset(root[:1]) if kind == "name" else frozenset()
            ), i
    # Possessive chain: "Maya's", "Maya's son's", "the customer's manager", "Ada's husband Jim".
    path: list[str] = []
    names: set[str] = set()
    while i < end:
        token = tokens[i]
        age = _FAMILY["age"].values
        if (
            token.low in {v for vs in age.values() for v in vs}
            and i + 1 < end
            and (tokens[i + 1].low in _RELATION_NOUNS)
        ):
            i += 1
            continue
        if token.low not in _RELATION_NOUNS:
            break
        path.append(token.low)
        i += 1
        while i < end and tokens[i].low == ",":
            i += 1
        run = _name_run(tokens, i, end, all_lower=False)
        if run > i:
            names.add(tokens[_skip_titles(tokens, i)].low)
            i = run
            while i < end and tokens[i].low == ",":
                i += 1
        if not tokens[i - 1].poss:
            break
    if kind == "name" and not path:
        names.add(root[0])
    return _Subject(kind, root, tuple(path), frozenset(names)), i


def _head_attribute(tokens: list[_Token], start: int, end: int) -> str | None:
    """The canonical attribute named by the noun phrase ``tokens[start:end]``."""
    words: list[str] = []
    depth = 0
    for token in tokens[start:end]:
        if token.low in {"(", ")"}:
            depth += 1 if token.low == "(" else -1
            continue
        if depth > 0:
            continue
        if token.punct or token.low in _PREPOSITIONS:
            break
        if (
            token.low in _DETERMINERS
            or token.low in _ADJECTIVES
            or token.low in _TIME_WORDS
            or token.text in _REGION_CODES
            or any(ch.isdigit() for ch in token.low)
            or token.low.startswith("#")
        ):
            continue
        words.append(token.low)
    if not words:
        return None
    head = words[-1]
    if head in _ATTRIBUTE_OF:
        return _ATTRIBUTE_OF[head]
    if head in _GENERIC_HEADS and len(words) > 1:
        previous = words[-2]
        if previous in _ATTRIBUTE_OF:
            return _ATTRIBUTE_OF[previous]
        return f"{_lemma(previous)}_{head}"
    if head in _TRIGGERS or head in _NUMBER_WORDS:
        return None  # "UK arm", "secondary": a qualifier without its attribute
    if len(words) > 1 and words[-2] not in _TRIGGERS and words[-2] not in _VOCABULARY:
        return f"{_lemma(words[-2])}_{_lemma(head)}"  # "data nodes" vs "master nodes"
    return _lemma(head)


def _lemma(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is", "ics")):
        return word[:-1]
    return word


_PREDICATE_ATTRIBUTES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(?:\w+\s+){0,2}(?:lives|living|lived|resides|based)\s+in\b"), "home_city"),
    (re.compile(r"^(?:\w+\s+){0,2}(?:moved|relocated|emigrated)\s+(?:back\s+)?to\b"), "home_city"),
    (re.compile(r"^(?:\w+\s+){0,2}lives\s+at\b"), "address"),
    (re.compile(r"\b(?:plan|tier|subscription|package|edition)\b"), "plan"),
    (re.compile(r"\b(?:seats?|licen[cs]es)\b"), "seats"),
    (re.compile(r"\ballergic\b|\ballerg(?:y|ies)\b"), "allergy"),
    (
        re.compile(
            r"^(?:\w+\s+){0,2}(?:(?:works?|working|worked)\s+(?:at|for|as|in)|employed|quit"
            r"|joined|hired|promoted|became|teaches|teaching)\b"
            r"|^is an? [\w-]+(?: [\w-]+)? (?:at|for|with)\b"
        ),
        "job",
    ),
    (re.compile(r"\bappointment\b"), "appointment"),
    (
        re.compile(
            r"^(?:\w+\s+){0,2}(?:prefers|prefer|likes|wants|would rather)\b.*\b(?:calls?|phone"
            r"|e-?mails?|texts?|sms|whatsapp|messages?|slack|teams|video|voice)\b"
        ),
        "contact_channel",
    ),
    (
        re.compile(r"^(?:\w+\s+){0,2}(?:takes|taking|prescribed|on)\b.*\b\d+\s*(?:mg|mcg|ml|iu)\b"),
        "medication",
    ),
    (re.compile(r"^(?:\w+\s+){0,2}(?:opens|closes)\b"), "opening_hours"),
    (re.compile(r"\b(?:headquartered|head office|hq)\b"), "home_city"),
    (re.compile(r"\b(?:on|to|version|release|v)\s*v?\d+\.\d+"), "version"),
)
# "renewed his driving licence", "updated her billing address": the object right after the verb.
_OBJECT_NP = re.compile(
    r"^(?:\w+\s+){1,2}?(?:his|her|their|its|my|our)\s+([\w-]+(?:\s+[\w-]+){0,3})"
)
_PRODUCT_VERSION = re.compile(
    r"\b([A-Z][\w.+-]*(?:\s+[A-Z][\w.+-]*)?|[a-z][\w.+-]*)\s+(?:from\s+)?v?(\d+(?:\.\d+)*)"
    r"(?![-/:\w])"
)


def _version_attribute(text: str) -> str | None:
    for match in _PRODUCT_VERSION.finditer(text):
        product = match[1]
        low = product.lower()
        words = low.split()
        if (
            (product.isupper() and len(product) <= 3)
            or words[-1] in _VOCABULARY
            or words[-1] in _UNIT_AFTER
        ):
            continue
        rest = text[match.end() :].lstrip().lower()
        if rest.split(" ", 1)[0].strip(".,;") in _UNIT_AFTER:
            continue
        if not (product[:1].isupper() or "." in match[2] or text.islower()):
            continue
        return re.sub(r"[^a-z0-9]+", "_", low).strip("_") + "_version"
    return None


def _qualifiers(tokens: list[_Token], region_end: int) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    n = len(tokens)
    for i, token in enumerate(tokens):
        pairs = _TRIGGERS.get(token.low)
        if not pairs or token.punct:
            continue
        trigger = _CANONICAL_TRIGGER.get(token.low, token.low)
        for family_name, value in pairs:
            family = _FAMILY[family_name]
            if _counts(tokens, i, trigger, family, region_end, n):
                found.setdefault(family_name, set()).add(value)
    # "flight back", "flight home", "flight out": a direction after its head noun.
    direction = _FAMILY["direction"]
    for k in range(len(tokens) - 1):
        if tokens[k].low in (direction.heads or ()) and tokens[k + 1].low in _DIRECTION_AFTER:
            found.setdefault("direction", set()).add(_DIRECTION_AFTER[tokens[k + 1].low])
    # Region codes in the subject mark a regional arm ("Baymark Cargo UK's headquarters").
    if any(t.text in _REGION_CODES for t in tokens[:region_end]):
        found.setdefault("scope", set()).add("local")
    # Identifiers in the subject tell instances apart ("Order #A-20417 ..." vs "Order #A-20433").
    ids = {t.low for t in tokens[:region_end] if _is_id(t)}
    ids |= {
        f"{tokens[k].low} {tokens[k + 1].low}"
        for k in range(min(region_end, len(tokens) - 1))
        if tokens[k].low in _UNIT_NOUNS and _UNIT_NUMBER.match(tokens[k + 1].text)
    }
    if ids:
        found.setdefault("id", set()).update(ids)
    return found


def _counts(
    tokens: list[_Token], i: int, trigger: str, family: Family, region_end: int, n: int
) -> bool:
    if trigger in family.loose:
        # Anywhere, except as a destination: "deployed to production" is a value, not a scope.
        return not (i and tokens[i - 1].low in {"to", "into", "from", "onto"})
    heads = family.heads
    if heads is not None and _post_modifies(tokens, i, heads):
        return True  # "mobile for work", "allowance on the return", "size L in tops"
    if i >= region_end and _in_value(tokens, i, region_end):
        return False  # "Maya is now on the support team": the qualifier is the new value
    if heads is None:
        if i < region_end:
            return True
        before = tokens[i - 1] if i else None
        after = tokens[i + 1] if i + 1 < n else None
        return bool(
            before is not None
            and (before.low in _DETERMINERS or before.poss)
            and after is not None
            and not after.punct
            and after.low not in _PREPOSITIONS | _AUX | _DETERMINERS
            and not _is_verb(tokens, i + 1)
        )
    if i < region_end and (
        trigger in heads
        or (
            (i == 0 or tokens[i - 1].poss or tokens[i - 1].low in _DETERMINERS)
            and (i + 1 == region_end or tokens[i + 1].punct or tokens[i + 1].low in _PREPOSITIONS)
        )
    ):
        return True  # "Amira's mobile changed", "Ben's eldest goes": the trigger is the head noun
    # Pre-modifier: "billing address", "return flight", "right knee", "personal mobile number".
    for j in range(i + 1, min(n, i + 4)):
        if tokens[j].punct or tokens[j].low in _PREPOSITIONS or tokens[j].low in _AUX:
            break
        if tokens[j].low in heads:
            return True
    return False


def _post_modifies(tokens: list[_Token], i: int, heads: frozenset[str]) -> bool:
    """A qualifier after its head: "mobile for work", "bags on the return", "size L in tops"."""
    if not i or tokens[i - 1].low not in _POST_LINKS:
        return False
    for j in range(i - 1, max(-1, i - 5), -1):
        if tokens[j].punct and tokens[j].low not in {"(", ","}:
            return False
        if tokens[j].low in heads:
            between = tokens[j + 1 : i]
            content = [t for t in between if t.low not in _POST_LINKS]
            linked = any(t.low in {"for", "on", "in", "of", "at"} for t in between)
            return linked and len(content) <= 1
    return False


def _in_value(tokens: list[_Token], i: int, region_end: int) -> bool:
    """Whether the noun phrase around ``tokens[i]`` is a value: after a copula or a change."""
    j = i - 1
    while j >= region_end and (
        tokens[j].low in _DETERMINERS or tokens[j].low in _POSSESSIVE_PRONOUNS or tokens[j].poss
    ):
        j -= 1
    if j < region_end or tokens[j].punct:
        return j >= 0 and tokens[j].low == ":" and j == region_end
    low = tokens[j].low
    if low in _COPULAS:
        return True  # "is the billing contact", "joined the sales team"
    if low not in _VALUE_PREPOSITIONS:
        return False
    # "is on the support team", "moved to the night shift": a preposition after a copula or a
    # change verb introduces the value; "surgery on his left knee" is a plain modifier.
    k = j - 1
    while k >= region_end and tokens[k].low in _PRE_VERB:
        k -= 1
    if k < 0:
        return False
    before = tokens[k].low
    return (
        before in _COPULAS
        or before in _CHANGE_VERBS
        or (k >= region_end and _is_verb(tokens, k))
        or (k < region_end and low in {"to", "from"})
    )


def _copula_value(tokens: list[_Token], region_end: int) -> str | None:
    i = region_end
    if i >= len(tokens) or tokens[i].low not in {"is", "are", "was", "were", ":"}:
        return None
    i += 1
    while i < len(tokens) and (
        tokens[i].low in _PRE_VERB
        or tokens[i].low in _DETERMINERS
        or tokens[i].low in _TITLES
        or tokens[i].low == "."
    ):
        i += 1
    return tokens[i].low if i < len(tokens) else None


def _is_id(token: _Token) -> bool:
    return bool(_IDENT.match(token.text))


def _instance(tokens: list[_Token]) -> str | None:
    for i, token in enumerate(tokens):
        marker = _INSTANCE_MARKERS.get(token.low)
        if marker is None or i + 1 >= len(tokens) or tokens[i + 1].punct:
            continue
        if token.low != "another" and (i == 0 or tokens[i - 1].low not in {"a", "an", "one"}):
            continue
        window = {t.low for t in tokens[max(0, i - 3) : i]}
        if window & _INSTANCE_BLOCKERS or tokens[i + 1].low in _PREPOSITIONS:
            continue
        return marker
    return None


@lru_cache(maxsize=8192)
def _analyse(text: str) -> _Features:
    tokens = _tokenize(text)
    # Discourse openers carry no subject: "Update: ...", "FYI, ...".
    while (
        tokens
        and tokens[0].low in {"update", "fyi", "btw", "note", "also", "ok", "so"}
        and (len(tokens) > 1 and tokens[1].punct)
    ):
        tokens = tokens[2:]
    all_lower = not any(ch.isupper() for ch in text)
    region_end, label = _subject_region(tokens)
    subject, after = _parse_subject(tokens, region_end, all_lower)
    if label and subject is not None and subject.kind == "thing":
        subject = None  # "Billing address: ..." names an attribute, not a subject
    attribute = _version_attribute(text)
    if attribute is None and after < region_end:
        attribute = _head_attribute(tokens, after, region_end)
    if attribute is None and subject is not None and subject.kind == "thing" and not label:
        attribute = _head_attribute(tokens, 0, region_end) if region_end else None
    if attribute is None or subject is None or subject.kind != "thing":
        predicate = " ".join(t.low for t in tokens[region_end:] if not t.punct)
        for pattern, name in _PREDICATE_ATTRIBUTES:
            if pattern.search(predicate):
                attribute = attribute or name
                break
        if attribute is None and (obj := _OBJECT_NP.search(predicate)):
            attribute = _head_attribute(_tokenize(obj[1]), 0, len(obj[1].split()))
    qualifiers = _qualifiers(tokens, region_end)
    ordinals = frozenset(
        t.low for t in tokens if t.low in _INSTANCE_MARKERS or t.low in {"first", "primary"}
    )
    lowercase = frozenset(t.low for t in tokens if t.text[:1].islower())
    words = frozenset(_lemma(t.low) for t in tokens if not t.punct) | frozenset(
        t.low for t in tokens if not t.punct
    )
    return _Features(
        words=words,
        copula_value=_copula_value(tokens, region_end),
        change_cue=bool(_CHANGE_CUE.search(text)),
        introduced=frozenset(
            _lemma(tokens[k + 1].low)
            for k in range(len(tokens) - 1)
            if tokens[k].low in _INTRODUCERS and not tokens[k + 1].punct
        ),
        subject=subject,
        attribute=attribute,
        qualifiers={k: frozenset(v) for k, v in qualifiers.items()},
        instance=_instance(tokens),
        ordinals=ordinals,
        lowercase_words=lowercase,
    )


# --- comparison ----------------------------------------------------------------------------------


def _prefix_compatible(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    shorter, longer = (a, b) if len(a) <= len(b) else (b, a)
    return longer[: len(shorter)] == shorter


def _compare_subjects(
    new: _Subject | None, old: _Subject | None, new_f: _Features, old_f: _Features
) -> str:
    """``same``, ``different`` or ``unknown``."""
    verdict = _compare_subject_shapes(new, old)
    if verdict != "different" or new is None or old is None:
        return verdict
    # "Cormac is our new IT lead" vs "Stonebridge's IT lead is Cormac Dunne": the old memory names
    # the new subject as a value, so the two may well be about one fact.
    if new.kind == "name" and not new.path and new.root[0] == old_f.copula_value:
        return "unknown"
    # "Redfern's owner is Felix" vs "Redfern has a new owner, Kit" (who holds the role changed), or
    # "Piers's dog is a lagotto" vs "Piers has a dog" (the other text introduces the relation).
    for a, b_f in ((new, old_f), (old, new_f)):
        other = old if a is new else new
        if (
            a.path
            and not other.path
            and ((a.path[-1] in b_f.words and b_f.change_cue) or a.path[-1] in b_f.introduced)
        ):
            return "unknown"
    return verdict


def _compare_subject_shapes(new: _Subject | None, old: _Subject | None) -> str:
    if new is None or old is None or "thing" in (new.kind, old.kind):
        if new is not None and old is not None and new.kind == old.kind == "thing":
            if _prefix_compatible(new.root, old.root):
                return "same"
            if (
                new.head == old.head
                and new.proper
                and old.proper
                and new.proper.isdisjoint(old.proper)
            ):
                return "different"
        return "unknown"
    if new.kind == old.kind == "name" and not (new.path or old.path):
        return "same" if _prefix_compatible(new.root, old.root) else "different"
    if new.names and old.names:
        return "same" if new.names & old.names else "different"
    if new.kind == "pron" or old.kind == "pron":
        if not new.root or not old.root or _prefix_compatible(new.root, old.root):
            return "same" if new.path == old.path else "different"
        return "unknown"
    if new.kind != old.kind:
        return "unknown"
    if not _prefix_compatible(new.root, old.root):
        # Two different named people (or companies): siblings. Two roles may be one person.
        return "different" if new.kind == "name" and not (new.path or old.path) else "unknown"
    if new.path == old.path:
        return "same"
    if (new.names and not old.path) or (old.names and not new.path):
        return "unknown"
    return "different"


def _demote_common_names(subject: _Subject | None, other: _Features) -> _Subject | None:
    """A capitalised sentence opener that the other text writes in lower case is a common noun."""
    if subject is None or subject.kind != "name" or subject.path:
        return subject
    if subject.root and subject.root[0] in other.lowercase_words:
        return None
    return subject


def _slug(key: str) -> str:
    return re.sub(r"[^a-z0-9/.]+", "_", key.strip().lower()).strip("_")


def infer_key(text: str) -> AttributeKey | None:
    """The attribute key a memory text is about, or None when no attribute can be named.

    >>> str(infer_key("Maya's billing address is 4 Elm Row, Leeds."))
    'maya/address[address:billing]'
    """
    features = _analyse(text)
    if features.attribute is None:
        return None
    qualifiers = frozenset(
        f"{family}:{value}" for family, values in features.qualifiers.items() for value in values
    )
    subject = features.subject.slug() if features.subject is not None else None
    if features.subject is not None and features.subject.kind in {"pron", "thing"}:
        subject = None if features.subject.kind == "pron" else subject
    return AttributeKey(subject=subject, attribute=features.attribute, qualifiers=qualifiers)


# "Route 9 ...", "Bay 4 ...", "Line 12 ...": a numbered thing as the sentence's subject. Two
# texts about different numbers of the same kind are about different things (siblings).
_NUMBERED_SUBJECT = re.compile(
    r"^\s*(?:[^,]{0,30},\s*)?(?:(?:the|our|their|his|her)\s+)?(?:[A-Z][\w'-]*\s+){0,2}?"
    r"(?P<kind>[A-Z][a-z]+)\s+(?:no\.?\s*|#)?(?P<num>\d[\w-]*)\b"
)


def _numbered_subjects(new_text: str, old_text: str) -> str | None:
    a, b = _NUMBERED_SUBJECT.match(new_text), _NUMBERED_SUBJECT.match(old_text)
    if a is None or b is None or a["kind"].lower() != b["kind"].lower():
        return None
    if a["num"].lower() == b["num"].lower():
        return None
    return f"instance:{a['kind'].lower()} {a['num']}!={b['num']}"


def relate(
    new_text: str, old_text: str, new_key: str | None = None, old_key: str | None = None
) -> Relation:
    """How the new fact relates to the stored memory: same attribute, sibling, or unknown.

    >>> relate("The return flight now leaves at 18:05.", "The outbound flight leaves at 07:10.")
    Relation(key_match=False, key_conflict=True, reason='qualifier:return!=outbound')
    """
    if new_key and old_key:
        a, b = _slug(new_key), _slug(old_key)
        if a == b:
            return Relation(True, False, "explicit:equal")
        return Relation(False, True, f"explicit:{a}!={b}")
    new, old = _analyse(new_text), _analyse(old_text)

    new_subject = _demote_common_names(new.subject, old)
    old_subject = _demote_common_names(old.subject, new)
    subjects = _compare_subjects(new_subject, old_subject, new, old)
    if subjects == "different":
        assert new_subject is not None and old_subject is not None
        return Relation(False, True, f"subject:{new_subject.slug()}!={old_subject.slug()}")
    if new.instance is not None and new.instance not in old.ordinals:
        return Relation(False, True, f"instance:{new.instance}")
    for family_name in _FAMILY_ORDER:
        a_values = new.qualifiers.get(family_name)
        b_values = old.qualifiers.get(family_name)
        if a_values and b_values and not a_values & b_values:
            a_text, b_text = "+".join(sorted(a_values)), "+".join(sorted(b_values))
            return Relation(False, True, f"qualifier:{a_text}!={b_text}")
    numbered = _numbered_subjects(new_text, old_text)
    if numbered is not None:
        return Relation(False, True, numbered)

    explicit = new_key or old_key
    if explicit:
        other = infer_key(old_text if new_key else new_text)
        wanted = _slug(explicit)
        if other is not None and wanted in {other.attribute, str(other).split("[")[0]}:
            return Relation(True, False, f"explicit:{wanted}")
        return Relation(False, False, f"explicit:{wanted}?")
    if new.attribute is None or old.attribute is None:
        return Relation(False, False, "attribute:unknown")
    if subjects == "unknown" and new_subject is not None and old_subject is not None:
        return Relation(False, False, f"subject:{new_subject.slug()}?{old_subject.slug()}")
    if new.attribute != old.attribute:
        return Relation(False, False, f"attribute:{new.attribute}!={old.attribute}")
    return Relation(True, False, f"attribute:{new.attribute}")
